#pragma once
/// @file
/// Activation checkpointing for LibTorch, which has none: a block runs in forward without keeping
/// its activations, and runs again in backward to compute its gradients, as Python's
/// `torch.utils.checkpoint` does (its reentrant variant). The random generators of the devices the
/// block's inputs live on (and the CPU's) are restored before the second run, so dropout replays
/// the same mask; checkpoints nest; dropit's layers inside cache only during the second run. An
/// input that a dropit producer made is recomputed from the producer's sources, not kept.
///
///     auto y = dropit::torch::checkpoint([&](const variable_list& x) { return variable_list{
///                                            block->forward(x[0])}; },
///                                        {input}, block->parameters());
///     dropit::torch::Checkpoint wrapped(block);   // a module: checkpoints its block in training

#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <torch/autograd.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/any.h>
#include <torch/nn/pimpl.h>

#include "../config.hpp"
#include "recompute.hpp"

namespace dropit::torch {

/// A checkpointed block: its inputs in, its outputs out.
using block_function =
    std::function<::torch::autograd::variable_list(const ::torch::autograd::variable_list&)>;

namespace detail {

/// The block and the generator states it first ran with, held by the autograd graph.
struct checkpointed_block : ::torch::CustomClassHolder {
  block_function run;
  std::vector<std::pair<at::Generator, at::Tensor>> generator_states;
};

/// The default generators of the CPU and of every other device `inputs` live on.
inline std::vector<at::Generator> generators_of(const ::torch::autograd::variable_list& inputs) {
  std::vector<at::Generator> generators{at::globalContext().defaultGenerator(c10::kCPU)};
  std::vector<c10::Device> seen;
  for (const auto& input : inputs) {
    if (!input.defined() || input.device().is_cpu()) continue;
    const c10::Device device = input.device();
    bool known = false;
    for (const auto& d : seen) known = known || d == device;
    if (known) continue;
    seen.push_back(device);
    generators.push_back(at::globalContext().defaultGenerator(device));
  }
  return generators;
}

/// Sets each generator to its saved state for the life of the guard, then back to where it was.
class generator_replay {
 public:
  explicit generator_replay(const std::vector<std::pair<at::Generator, at::Tensor>>& saved) {
    for (const auto& [generator, state] : saved) {
      at::Generator g = generator;
      std::lock_guard<std::mutex> lock(g.mutex());
      current_.emplace_back(g, g.get_state());
      g.set_state(state);
    }
  }
  ~generator_replay() {
    for (auto& [generator, state] : current_) {
      std::lock_guard<std::mutex> lock(generator.mutex());
      generator.set_state(state);
    }
  }
  generator_replay(const generator_replay&) = delete;
  generator_replay& operator=(const generator_replay&) = delete;

 private:
  std::vector<std::pair<at::Generator, at::Tensor>> current_;
};

/// The autograd function: forward without gradients; backward runs the block again with
/// gradients and back-propagates through that second run. The parameters are inputs only so that
/// the output requires a gradient when they do (a block fed by data that needs none); their
/// gradients accumulate during the second run's backward, as in any backward.
class checkpoint_function : public ::torch::autograd::Function<checkpoint_function> {
 public:
  static ::torch::autograd::variable_list forward(::torch::autograd::AutogradContext* ctx,
                                                  c10::intrusive_ptr<checkpointed_block> block,
                                                  std::size_t input_count,
                                                  at::TensorList inputs_and_parameters) {
    const ::torch::autograd::variable_list inputs(
        inputs_and_parameters.begin(),
        inputs_and_parameters.begin() + static_cast<std::ptrdiff_t>(input_count));
    for (auto& generator : generators_of(inputs)) {
      std::lock_guard<std::mutex> lock(generator.mutex());
      block->generator_states.emplace_back(generator, generator.get_state());
    }
    // An input a dropit producer made (and autograd keeps the producer's sources anyway) is saved
    // as that recipe and recomputed in backward: a checkpoint after BatchNorm -> ReLU, say, then
    // holds nothing of its own.
    ::torch::autograd::variable_list saved;
    std::vector<std::int64_t> recomputed_sources;  // per input: the recipe's sources, or -1
    c10::List<bool> requires_grad;
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      requires_grad.push_back(inputs[i].defined() && inputs[i].requires_grad());
      const auto recomputable = recipe_of(inputs[i]);
      if (!recomputable) {
        saved.push_back(inputs[i]);
        recomputed_sources.push_back(-1);
        continue;
      }
      recomputable->recipe.save(ctx, "input" + std::to_string(i));
      saved.insert(saved.end(), recomputable->sources.begin(), recomputable->sources.end());
      recomputed_sources.push_back(static_cast<std::int64_t>(recomputable->sources.size()));
    }
    ctx->save_for_backward(saved);
    ctx->saved_data["recomputed_sources"] = recomputed_sources;
    ctx->saved_data["requires_grad"] = requires_grad;
    ctx->saved_data["block"] = c10::IValue::make_capsule(block);
    ctx->saved_data["parameters"] =
        static_cast<std::int64_t>(inputs_and_parameters.size() - input_count);
    auto outputs = block->run(inputs);
    dropit::detail::expect(!outputs.empty(),
                           "checkpoint: the block returned no tensor; expected at least one");
    for (std::size_t i = 0; i < outputs.size(); ++i) {
      dropit::detail::expect(outputs[i].defined(), "checkpoint: the block's output ", i,
                             " is undefined; expected a tensor");
      // An output that is an input as it came in would be that input itself, not a new result.
      for (const auto& input : inputs)
        if (input.defined() && outputs[i].is_same(input)) outputs[i] = outputs[i].clone();
    }
    return outputs;
  }

  static ::torch::autograd::variable_list backward(::torch::autograd::AutogradContext* ctx,
                                                   ::torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto block = c10::static_intrusive_pointer_cast<checkpointed_block>(
        ctx->saved_data["block"].toCapsule());
    const std::vector<std::int64_t> recomputed_sources =
        ctx->saved_data["recomputed_sources"].toIntVector();
    const c10::List<bool> requires_grad = ctx->saved_data["requires_grad"].toBoolList();
    ::torch::autograd::variable_list inputs;
    auto next = saved.begin();
    for (std::size_t i = 0; i < recomputed_sources.size(); ++i) {
      at::Tensor input;
      if (recomputed_sources[i] < 0) {
        input = *next++;
      } else {
        const std::vector<at::Tensor> sources(next, next + recomputed_sources[i]);
        next += recomputed_sources[i];
        const at::NoGradGuard no_grad;
        input = producer_recipe::load(ctx, "input" + std::to_string(i)).compute(sources);
      }
      inputs.push_back(input.defined() ? input.detach().requires_grad_(requires_grad[i]) : input);
    }
    ::torch::autograd::variable_list outputs;
    {
      const generator_replay replay(block->generator_states);
      const at::AutoGradMode with_gradients(true);
      outputs = block->run(inputs);
    }
    ::torch::autograd::variable_list differentiable, upstream;
    for (std::size_t i = 0; i < outputs.size() && i < grads.size(); ++i) {
      if (!outputs[i].requires_grad() || !grads[i].defined()) continue;
      differentiable.push_back(outputs[i]);
      upstream.push_back(grads[i]);
    }
    if (!differentiable.empty()) ::torch::autograd::backward(differentiable, upstream);
    ::torch::autograd::variable_list result{at::Tensor(), at::Tensor()};  // block, input_count
    for (const auto& input : inputs)
      result.push_back(input.defined() && input.requires_grad() ? input.grad() : at::Tensor());
    result.resize(result.size() + static_cast<std::size_t>(ctx->saved_data["parameters"].toInt()));
    return result;
  }
};

}  // namespace detail

/// `block(inputs)` without keeping its activations for backward: backward runs it again. Pass the
/// parameters the block uses, so that its output needs a gradient when they do (even where no
/// input does); their gradients accumulate as in any backward. With gradients off it is
/// `block(inputs)`. The block must compute the same thing twice (no state it changes between
/// the runs, but random generators, which are replayed).
inline ::torch::autograd::variable_list checkpoint(block_function block,
                                                   const ::torch::autograd::variable_list& inputs,
                                                   const std::vector<at::Tensor>& parameters = {}) {
  dropit::detail::expect(static_cast<bool>(block), "checkpoint: the block is empty");
  if (!at::GradMode::is_enabled()) return block(inputs);
  auto holder = c10::make_intrusive<detail::checkpointed_block>();
  holder->run = std::move(block);
  ::torch::autograd::variable_list inputs_and_parameters(inputs);
  inputs_and_parameters.insert(inputs_and_parameters.end(), parameters.begin(), parameters.end());
  // As a TensorList: the autograd function takes each of its tensors as an input.
  return detail::checkpoint_function::apply(std::move(holder), inputs.size(),
                                            at::TensorList(inputs_and_parameters));
}

/// A module that checkpoints the block it wraps (any module whose `forward` takes and returns one
/// tensor, `Sequential` included) in training mode with gradients on, and runs it plainly
/// otherwise. The block's buffers are restored after its second run, so BatchNorm's running
/// statistics are updated once per step, as without the checkpoint (the function `checkpoint`,
/// which knows no module, updates them twice, as Python's does). The block is its submodule
/// "block": parameters, state dicts and `to()` reach it.
class CheckpointImpl : public ::torch::nn::Module {
 public:
  template <class ModuleType>
  explicit CheckpointImpl(ModuleType block)
      : block_(register_module("block", block.ptr())),
        forward_([impl = block.ptr().get()](const at::Tensor& x) -> at::Tensor {
          return impl->forward(x);
        }) {}

  /// Wraps the module in a Sequential's type-erased slot.
  explicit CheckpointImpl(const ::torch::nn::AnyModule& block)
      : block_(register_module("block", block.ptr())),
        forward_([module = ::torch::nn::AnyModule(block)](const at::Tensor& x) mutable {
          return module.forward<at::Tensor>(x);
        }) {}

  at::Tensor forward(const at::Tensor& input) {
    if (!is_training() || !at::GradMode::is_enabled()) return forward_(input);
    return checkpoint(
        [this](const ::torch::autograd::variable_list& x) {
          // The first run has gradients off; the second, in backward, on. The block's buffers
          // (BatchNorm's running statistics) move once per step, as without the checkpoint.
          if (!at::GradMode::is_enabled()) return ::torch::autograd::variable_list{forward_(x[0])};
          std::vector<std::pair<at::Tensor, at::Tensor>> buffers;
          for (const at::Tensor& buffer : block_->buffers())
            if (buffer.defined()) buffers.emplace_back(buffer, buffer.clone());
          at::Tensor output = forward_(x[0]);
          // Through a view with a version counter of its own: the second run's batch norm saved
          // the running statistics (its backward in training mode does not read them), and an
          // in-place change of a saved tensor would fail that backward's version check.
          for (auto& [buffer, before] : buffers) buffer.variable_data().copy_(before);
          return ::torch::autograd::variable_list{output};
        },
        {input}, parameters())[0];
  }

  /// The wrapped module.
  std::shared_ptr<::torch::nn::Module> block() const { return block_; }

 private:
  std::shared_ptr<::torch::nn::Module> block_;
  std::function<at::Tensor(const at::Tensor&)> forward_;
};

class Checkpoint : public ::torch::nn::ModuleHolder<CheckpointImpl> {
 public:
  using ::torch::nn::ModuleHolder<CheckpointImpl>::ModuleHolder;
  using Impl = CheckpointImpl;
};

}  // namespace dropit::torch
