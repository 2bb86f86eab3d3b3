#pragma once
/// @file
/// Exact recomputation of a layer's input. A cheap producer (dropit::torch::LayerNorm, BatchNorm2d,
/// GELU, SiLU, and a dropit ReLU applied to a producer's output) marks its output with how to
/// compute it again from tensors autograd keeps anyway for the producer's own backward (its input
/// and parameters). A dropit Linear or Conv2d that reads such an output, untouched, saves those
/// tensors instead of a cache and recomputes its input in backward with the same kernels (after
/// BatchNorm in training, one affine pass from the batch statistics it saved, equal within
/// rounding): it holds nothing of its own, and its weight gradient is the dense one, whatever γ.
///
/// The chain can go on through a layer: such a Linear or Conv2d marks its own output (its forward
/// again on the recomputed input), as does a layer that keeps its input as it is (the model's own:
/// DropitOptions::keep_input), and a producer reading that output with recompute_layers on keeps
/// none of its input either (RecomputedInputProducerFunction): BatchNorm after a convolution after
/// BatchNorm -> ReLU or after the network's first convolution, GELU after a Linear after
/// LayerNorm. One more forward of the layer in backward buys the producer's input; a layer reading
/// that producer's output recomputes it the same way, without running the layer twice.
///
/// The marks are held weakly, per thread: marking keeps no tensor alive, and a layer that finds no
/// valid mark (another thread, a view or an in-place change of the output, a changed source,
/// autocast) caches its input as before.

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <torch/autograd.h>

#include "../config.hpp"
#include "compat.hpp"
#include "functions.hpp"

namespace dropit::torch {
namespace detail {

/// A tensor recomputed inside a longer chain, handed to the function that recomputes it for its
/// own backward (its owner), which takes it instead of computing it again. It lives from the
/// chain's backward to the owner's, the next few nodes.
struct recompute_memo : ::torch::CustomClassHolder {
  at::Tensor value;
};

/// How a producer computes its output from its sources. With `input` set, the producer's input is
/// no source: that recipe computes it again from the sources after this recipe's own (a chain
/// through a layer, see DropitOptions::recompute_layers).
struct producer_recipe {
  /// linear and conv2d: a dropit layer whose own input is recomputed or kept as it is
  /// (DropitOptions::keep_input).
  enum class kind : std::int64_t { layer_norm, batch_norm, gelu, silu, linear, conv2d };

  kind what = kind::gelu;
  std::vector<std::int64_t> normalized_shape;  // layer_norm
  double eps = 0.0;                            // layer_norm, batch_norm
  /// batch_norm: normalised with the batch's own statistics (training), else the running ones.
  bool batch_statistics = true;
  std::string approximate = "none";  // gelu
  conv2d_params convolution{};       // conv2d
  /// A dropit ReLU ran on the producer's output.
  bool relu = false;
  /// How the input is computed again, when it is not a source; `parameters` counts this recipe's
  /// own sources (the ones before the input recipe's).
  std::shared_ptr<const producer_recipe> input;
  std::int64_t parameters = 0;
  /// Where a chain computing this recipe (as another's input) leaves its output for the function
  /// that owns it (see recompute_memo); none where nothing else recomputes it.
  c10::intrusive_ptr<recompute_memo> memo;

  bool is_layer() const { return what == kind::linear || what == kind::conv2d; }

  /// Whether computing the output runs a Linear or Conv2d forward again.
  bool runs_layer() const { return is_layer() || (input && input->runs_layer()); }

  /// How many layer forwards it runs on inputs that are themselves computed again: a layer that
  /// kept its input as it is (the model's own) runs on that input and counts not.
  int layers_on_recomputed_inputs() const {
    return input ? (is_layer() ? 1 : 0) + input->layers_on_recomputed_inputs() : 0;
  }

  /// The producer's output. Sources: layer_norm (input, weight, bias); batch_norm (input, weight,
  /// bias, then the running mean and variance unless batch_statistics, else the batch's mean and
  /// inverse standard deviation when the forward's autograd node keeps them); gelu and silu
  /// (input); linear and conv2d (input, weight, bias). With `input` set, the first is left out and
  /// the input recipe's sources follow.
  at::Tensor compute(const std::vector<at::Tensor>& sources) const {
    at::Tensor output;
    if (input) {
      // Another chain through the same input (two layers reading one producer's output) may have
      // left it already; it stays there for its owner.
      const bool left = input->memo && input->memo->value.defined();
      std::vector<at::Tensor> own{
          left ? input->memo->value
               : input->compute(std::vector<at::Tensor>(
                     sources.begin() + static_cast<std::ptrdiff_t>(parameters), sources.end()))};
      if (input->memo) input->memo->value = own.front();
      own.insert(own.end(), sources.begin(),
                 sources.begin() + static_cast<std::ptrdiff_t>(parameters));
      output = compute_producer(own);
    } else {
      output = compute_producer(sources);
    }
    // In place on the fresh producer output: one activation transient in backward, as dense
    // holds. max(x, 0), as dropit's ReLU kernel computed it in forward.
    return relu ? output.relu_() : output;
  }

  /// The output its owner needs: the one a chain left in the memo, else computed.
  at::Tensor take_or_compute(const std::vector<at::Tensor>& sources) const {
    if (memo && memo->value.defined()) return std::exchange(memo->value, at::Tensor());
    return compute(sources);
  }

  /// BatchNorm's forward: torch's kernel (the one torch::nn::BatchNorm2d reaches on the CPU), as
  /// (output, the batch's mean, its inverse standard deviation); the two statistics are defined
  /// when `batch_statistics`.
  static std::tuple<at::Tensor, at::Tensor, at::Tensor> batch_norm(
      const at::Tensor& input, const at::Tensor& weight, const at::Tensor& bias,
      const at::Tensor& running_mean, const at::Tensor& running_var, bool batch_statistics,
      double momentum, double eps) {
    return at::native_batch_norm(input, weight, bias, running_mean, running_var, batch_statistics,
                                 momentum, eps);
  }

  /// BatchNorm's output again from the statistics its forward normalised with: one affine pass
  /// y = x·α + β per channel (α = invstd·weight, β = bias − mean·α), where running the kernel in
  /// training again would first reduce over the batch (several times the pass on the CPU). The pass
  /// is torch's batch-norm kernel in eval mode with mean 0, variance 1 and eps 0 (vectorised per
  /// channel; an addcmul broadcasting α and β is slower on NCHW). α and β in at least float32, as
  /// the forward's kernel computes them for a 16-bit input. That kernel rounds in its own order
  /// (on CUDA it computes (x − mean)·invstd·w + b), so y agrees with the forward's within rounding:
  /// on the CPU, in the last bit. On CUDA, with statistics in the input's accumulation type (as
  /// torch's and cuDNN's kernels save them), torch's own elementwise kernel of the training forward
  /// reads the mean and invstd as they are: one launch where the pass above takes eight.
  static at::Tensor normalise(const at::Tensor& input, const at::Tensor& weight,
                              const at::Tensor& bias, const at::Tensor& mean,
                              const at::Tensor& invstd) {
    const at::ScalarType type = at::promote_types(invstd.scalar_type(), at::kFloat);
    const at::ScalarType accumulation = at::promote_types(input.scalar_type(), at::kFloat);
    const auto parameter_type_fits = [&](const at::Tensor& parameter) {
      return !parameter.defined() || parameter.scalar_type() == input.scalar_type() ||
             parameter.scalar_type() == accumulation;
    };
    if (input.is_cuda() && mean.scalar_type() == accumulation &&
        invstd.scalar_type() == accumulation && parameter_type_fits(weight) &&
        parameter_type_fits(bias))
      return at::batch_norm_elemt(input, weight, bias, mean, invstd, /*eps=*/0.0);
    at::Tensor alpha = invstd.to(type);
    if (weight.defined()) alpha = alpha * weight.to(type);
    at::Tensor beta = -mean.to(type) * alpha;
    if (bias.defined()) beta = beta + bias.to(type);
    return std::get<0>(batch_norm(input, alpha, beta, at::zeros_like(alpha), at::ones_like(alpha),
                                  /*batch_statistics=*/false, 0.0, /*eps=*/0.0));
  }

  at::Tensor compute_producer(const std::vector<at::Tensor>& sources) const {
    switch (what) {
      case kind::layer_norm:
        return at::layer_norm(sources.at(0), normalized_shape, sources.at(1), sources.at(2), eps);
      case kind::batch_norm:
        if (!batch_statistics)
          return std::get<0>(batch_norm(sources.at(0), sources.at(1), sources.at(2), sources.at(3),
                                        sources.at(4), false, 0.0, eps));
        if (sources.size() == 5)
          return normalise(sources[0], sources[1], sources[2], sources[3], sources[4]);
        // No statistics kept: the kernel again, which recomputes them from the input (and
        // updates no running statistics).
        return std::get<0>(
            batch_norm(sources.at(0), sources.at(1), sources.at(2), {}, {}, true, 0.0, eps));
      case kind::gelu:
        return at::gelu(sources.at(0), approximate);
      case kind::silu:
        return at::silu(sources.at(0));
      case kind::linear:
        return at::linear(sources.at(0), sources.at(1), sources.at(2));
      case kind::conv2d:
        return at::conv2d(sources.at(0), sources.at(1), sources.at(2),
                          torch_pair(convolution.stride), torch_pair(convolution.padding),
                          torch_pair(convolution.dilation), convolution.groups);
    }
    dropit::detail::fail("unknown producer recipe ", static_cast<std::int64_t>(what));
  }

  /// Kept for backward whole, as one entry of autograd's saved data (see save_value); `key` tells
  /// apart the recipes of one function's several inputs.
  void save(::torch::autograd::AutogradContext* ctx, const std::string& key = "recipe") const {
    save_value(ctx, key, *this);
  }
  static const producer_recipe& load(::torch::autograd::AutogradContext* ctx,
                                     const std::string& key = "recipe") {
    return load_value<producer_recipe>(ctx, key);
  }
};

/// A producer's output that a layer may recompute: its recipe and sources.
struct recomputable_input {
  producer_recipe recipe;
  std::vector<at::Tensor> sources;
};

/// `recomputable` with a fresh memo: for a function that recomputes it and a chain, marked on its
/// output, that computes it on the way (the function takes what the chain left).
inline recomputable_input with_memo(recomputable_input recomputable) {
  recomputable.recipe.memo = c10::make_intrusive<recompute_memo>();
  return recomputable;
}

/// `outer` applied to the output `inner` recomputes: `outer`'s own sources (its input left out)
/// first, then `inner`'s.
inline recomputable_input chained(producer_recipe outer, std::vector<at::Tensor> own_sources,
                                  const recomputable_input& inner) {
  outer.input = std::make_shared<const producer_recipe>(inner.recipe);
  outer.parameters = static_cast<std::int64_t>(own_sources.size());
  own_sources.insert(own_sources.end(), inner.sources.begin(), inner.sources.end());
  return {std::move(outer), std::move(own_sources)};
}

using weak_tensor = c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>;

struct marked_output {
  weak_tensor output{c10::intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>()};
  /// The tensor the output is a view of, where both are contiguous and the output views all of it
  /// (a layer's [B, T, n] output of a [B·T, n] product: the same elements in the same order), else
  /// the output itself. Views a caller takes of the output (q, k and v of a projection) find the
  /// mark through it after the output itself is gone.
  weak_tensor root{c10::intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>()};
  std::int64_t output_version = 0;
  producer_recipe recipe;
  std::vector<weak_tensor> sources;
  std::vector<bool> source_defined;
  std::vector<std::int64_t> source_versions;
};

/// The tensor `t` is a view of (itself where it is none).
inline at::Tensor root_of(const at::Tensor& t) { return t.is_view() ? at::Tensor(t._base()) : t; }

/// This thread's marks; entries whose output and root are gone are dropped at the next mark.
inline std::vector<marked_output>& marked_outputs() {
  thread_local std::vector<marked_output> marks;
  return marks;
}

/// Marks `output` as `recipe.compute(sources)`, when autograd records (a layer under no-grad
/// saves nothing anyway).
inline void mark_recomputable(const at::Tensor& output, producer_recipe recipe,
                              const std::vector<at::Tensor>& sources) {
  if (!at::GradMode::is_enabled()) return;
  auto& marks = marked_outputs();
  std::erase_if(marks, [](const marked_output& m) { return m.root.expired(); });
  marked_output m;
  m.output = weak_tensor(output.getIntrusivePtr());
  const at::Tensor root = root_of(output);
  const bool whole_root =
      root.numel() == output.numel() && root.is_contiguous() && output.is_contiguous();
  m.root = weak_tensor((whole_root ? root : output).getIntrusivePtr());
  m.output_version = static_cast<std::int64_t>(output._version());
  m.recipe = std::move(recipe);
  for (const at::Tensor& source : sources) {
    m.sources.emplace_back(source.getIntrusivePtr());
    m.source_defined.push_back(source.defined());
    m.source_versions.push_back(source.defined() ? static_cast<std::int64_t>(source._version())
                                                 : 0);
  }
  marks.push_back(std::move(m));
}

inline void mark_recomputable(const at::Tensor& output, const recomputable_input& recomputable) {
  mark_recomputable(output, recomputable.recipe, recomputable.sources);
}

/// `recipe.compute(sources)`, marked as recomputable from them: a producer's forward.
inline at::Tensor produce(producer_recipe recipe, const std::vector<at::Tensor>& sources) {
  at::Tensor output = recipe.compute(sources);
  mark_recomputable(output, std::move(recipe), sources);
  return output;
}

/// The recipe and sources of the mark whose `field` (marked_output::output or ::root) is `tensor`,
/// when neither the output (whose version counter `tensor` shares) nor a source has changed since
/// and autocast is off; otherwise none. A layer's own output counts only `through_layers`.
inline std::optional<recomputable_input> recipe_of_marked(weak_tensor marked_output::*field,
                                                          const at::Tensor& tensor,
                                                          bool through_layers) {
  if (!tensor.defined() || compat::autocast_dtype(tensor.device())) return std::nullopt;
  const auto& marks = marked_outputs();
  const auto found = std::find_if(marks.rbegin(), marks.rend(), [&](const marked_output& m) {
    return (m.*field)._unsafe_get_target() == tensor.unsafeGetTensorImpl() && !(m.*field).expired();
  });
  if (found == marks.rend() ||
      found->output_version != static_cast<std::int64_t>(tensor._version()) ||
      (!through_layers && found->recipe.is_layer()))
    return std::nullopt;
  recomputable_input r{found->recipe, {}};
  for (std::size_t i = 0; i < found->sources.size(); ++i) {
    at::Tensor source(found->sources[i].lock());
    if (source.defined() != found->source_defined[i] ||
        (source.defined() &&
         static_cast<std::int64_t>(source._version()) != found->source_versions[i]))
      return std::nullopt;
    r.sources.push_back(std::move(source));
  }
  return r;
}

/// The recipe and sources of `input` when it is a marked output that neither it nor its sources
/// have changed since (and autocast is off: the layer would compute in another dtype than the
/// producer's output); otherwise none. A layer's own output counts only `through_layers`; a
/// producer's output whose recipe runs a layer again counts always: that producer kept none of its
/// input, and its own backward runs the layer anyway.
inline std::optional<recomputable_input> recipe_of(const at::Tensor& input,
                                                   bool through_layers = false) {
  return recipe_of_marked(&marked_output::output, input, through_layers);
}

/// As recipe_of, for the marked output that `root` is (or is the whole of, see
/// marked_output::root), whether or not the output itself is still alive.
inline std::optional<recomputable_input> recipe_of_root(const at::Tensor& root,
                                                        bool through_layers = false) {
  return recipe_of_marked(&marked_output::root, root, through_layers);
}

/// What a layer recomputing its input keeps for backward: its weight and the producer's sources
/// (which the producer's own backward keeps anyway) as saved tensors, and the producer's recipe.
struct recomputing_layer_state {
  saved_tensors saved;  // the weight, then the producer's sources
  producer_recipe recipe;

  void save(const at::Tensor& weight, const recomputable_input& recomputable) {
    recipe = recomputable.recipe;
    saved.save(weight);
    for (const at::Tensor& source : recomputable.sources) saved.save(source);
  }

  /// The layer's input again, from `saved` (what `save` kept, unpacked).
  at::Tensor recompute_input(const ::torch::autograd::variable_list& saved) const {
    const at::NoGradGuard no_grad;
    return recipe.take_or_compute(std::vector<at::Tensor>(saved.begin() + 1, saved.end()));
  }
};

}  // namespace detail

/// y = x Wᵀ + b for an input a producer can compute again: keeps the weight and the producer's
/// sources and recomputes x for the weight gradient. The sources are not inputs of this node:
/// x's gradient flows through x. `bias` may be undefined.
struct RecomputedInputLinearFunction {
  struct backward_state : detail::recomputing_layer_state {
    static constexpr const char* name = "dropit::RecomputingLinearBackward";

    ::torch::autograd::variable_list backward(const ::torch::autograd::Node& node,
                                              const at::Tensor& dz,
                                              const ::torch::autograd::variable_list& saved) const {
      const at::Tensor& weight = saved[0];
      const at::Tensor dz_rows = dz.reshape({-1, compat::static_sizes(dz).back()});
      at::Tensor d_input, d_weight, d_bias;
      if (node.task_should_compute_output(0)) d_input = at::matmul(dz, weight);
      if (node.task_should_compute_output(1)) {
        const at::Tensor input = recompute_input(saved);
        d_weight = dz_rows.t().mm(input.reshape({-1, compat::static_sizes(input).back()}));
      }
      // A missing bias has no gradient edge, so the node computes no gradient for it.
      if (node.task_should_compute_output(2)) d_bias = dz_rows.sum(0);
      return {d_input, d_weight, d_bias};
    }
  };

  static at::Tensor apply(const at::Tensor& input, const at::Tensor& weight,
                          const at::Tensor& bias, const detail::recomputable_input& recomputable) {
    return detail::record_layer<backward_state>({input, weight, bias}, [&](backward_state& state) {
      state.save(weight, recomputable);
      return at::linear(input, weight, bias);
    });
  }
};

/// Conv2d (zero padding) for an input a producer can compute again, as the linear one above. The
/// backward is torch's own convolution backward on the recomputed input: the dense gradients.
struct RecomputedInputConv2dFunction {
  struct backward_state : detail::recomputing_layer_state {
    static constexpr const char* name = "dropit::RecomputingConv2dBackward";
    detail::conv2d_call call;

    ::torch::autograd::variable_list backward(const ::torch::autograd::Node& node,
                                              const at::Tensor& dz,
                                              const ::torch::autograd::variable_list& saved) const {
      const at::Tensor& weight = saved[0];
      const auto& [input_sizes, params] = call;
      const bool want_input = node.task_should_compute_output(0);
      const bool want_weight = node.task_should_compute_output(1);
      const bool want_bias = node.task_should_compute_output(2);
      at::Tensor d_input, d_weight, d_bias;
      if (want_weight) {  // torch's convolution backward, as the dense layer's, bias included
        std::tie(d_input, d_weight, d_bias) = dense_conv2d_backward(
            dz, recompute_input(saved), weight, params, {want_input, true, want_bias});
      } else if (want_input) {
        d_input = conv2d_input_grad(dz.contiguous(), weight, input_sizes, params);
      }
      if (want_bias && !d_bias.defined()) d_bias = dz.sum({0, 2, 3});
      return {d_input, d_weight, d_bias};
    }
  };

  static at::Tensor apply(const at::Tensor& input, const at::Tensor& weight,
                          const at::Tensor& bias, const conv2d_params& params,
                          const detail::recomputable_input& recomputable) {
    return detail::record_layer<backward_state>({input, weight, bias}, [&](backward_state& state) {
      state.call = {compat::static_sizes(input), params};
      state.save(weight, recomputable);
      return at::conv2d(input, weight, bias, torch_pair(params.stride),
                        torch_pair(params.padding), torch_pair(params.dilation), params.groups);
    });
  }
};

/// What a producer's forward needs besides its input and parameters.
struct producer_call {
  explicit producer_call(detail::producer_recipe recipe, at::Tensor running_mean = {},
                         at::Tensor running_var = {}, double momentum = 0.0)
      : recipe(std::move(recipe)),
        running_mean(std::move(running_mean)),
        running_var(std::move(running_var)),
        momentum(momentum) {}

  detail::producer_recipe recipe;        // the producer's own (no input recipe)
  at::Tensor running_mean, running_var;  // batch_norm
  double momentum = 0.0;                 // batch_norm
};

/// A producer (LayerNorm, BatchNorm2d, GELU, SiLU) whose input a recipe through a layer computes
/// again (DropitOptions::recompute_layers): the forward is the producer's own kernel; it saves the
/// recipe's sources (which the layer that made its input keeps anyway) instead of its input, and
/// backward computes the input again and runs torch's backward kernel of the producer. Returns the
/// output, then the statistics the forward computed (LayerNorm: mean and rstd; BatchNorm2d in
/// training: the batch's mean and invstd).
struct RecomputedInputProducerFunction
    : public ::torch::autograd::Function<RecomputedInputProducerFunction> {
  using kind = detail::producer_recipe::kind;

  /// `weight_argument`, `bias_argument`: as compat::optional_argument passes them.
  static ::torch::autograd::variable_list forward(::torch::autograd::AutogradContext* ctx,
                                                  const at::Tensor& input,
                                                  const at::Tensor& weight_argument,
                                                  const at::Tensor& bias_argument,
                                                  const producer_call& call,
                                                  const detail::recomputable_input& recomputable) {
    const at::Tensor weight = compat::from_optional_argument(weight_argument);
    const at::Tensor bias = compat::from_optional_argument(bias_argument);
    const detail::producer_recipe& recipe = call.recipe;
    at::Tensor output, first, second;
    switch (recipe.what) {
      case kind::layer_norm:
        std::tie(output, first, second) =
            at::native_layer_norm(input, recipe.normalized_shape, weight, bias, recipe.eps);
        break;
      case kind::batch_norm:
        std::tie(output, first, second) = detail::producer_recipe::batch_norm(
            input, weight, bias, call.running_mean, call.running_var, recipe.batch_statistics,
            call.momentum, recipe.eps);
        break;
      case kind::gelu:
        output = at::gelu(input, recipe.approximate);
        break;
      case kind::silu:
        output = at::silu(input);
        break;
      default:
        dropit::detail::fail("a ", static_cast<std::int64_t>(recipe.what),
                             " recipe names no producer with a backward of its own");
    }
    recipe.save(ctx, "producer");
    recomputable.recipe.save(ctx);
    const bool running = recipe.what == kind::batch_norm && !recipe.batch_statistics;
    ::torch::autograd::variable_list saved{weight, bias, running ? call.running_mean : first,
                                           running ? call.running_var : second};
    saved.insert(saved.end(), recomputable.sources.begin(), recomputable.sources.end());
    ctx->save_for_backward(saved);
    if (running || !first.defined()) return {output};
    ctx->mark_non_differentiable({first, second});
    return {output, first, second};
  }

  static ::torch::autograd::variable_list backward(::torch::autograd::AutogradContext* ctx,
                                                   ::torch::autograd::variable_list grads) {
    const ::torch::autograd::variable_list saved = ctx->get_saved_variables();
    const at::Tensor &weight = saved[0], &bias = saved[1], &first = saved[2], &second = saved[3];
    const detail::producer_recipe& recipe = detail::producer_recipe::load(ctx, "producer");
    at::Tensor input;
    {
      const at::NoGradGuard no_grad;
      input = detail::producer_recipe::load(ctx).take_or_compute(
          std::vector<at::Tensor>(saved.begin() + 4, saved.end()));
    }
    const std::array<bool, 3> wanted{ctx->needs_input_grad(0),
                                     weight.defined() && ctx->needs_input_grad(1),
                                     bias.defined() && ctx->needs_input_grad(2)};
    const at::Tensor& dy = grads[0];
    at::Tensor d_input, d_weight, d_bias;
    switch (recipe.what) {
      case kind::layer_norm:
        std::tie(d_input, d_weight, d_bias) = at::native_layer_norm_backward(
            dy, input, recipe.normalized_shape, first, second, weight, bias, wanted);
        break;
      case kind::batch_norm:
        // Saved: the batch's mean and invstd, or the running mean and variance.
        std::tie(d_input, d_weight, d_bias) =
            recipe.batch_statistics
                ? at::native_batch_norm_backward(dy, input, weight, {}, {}, first, second, true,
                                                 recipe.eps, wanted)
                : at::native_batch_norm_backward(dy, input, weight, first, second, {}, {}, false,
                                                 recipe.eps, wanted);
        break;
      case kind::gelu:
        d_input = at::gelu_backward(dy, input, recipe.approximate);
        break;
      default:  // silu
        d_input = at::silu_backward(dy, input);
        break;
    }
    return {d_input, d_weight, d_bias, at::Tensor(), at::Tensor()};
  }
};

namespace detail {

/// The most layers on recomputed inputs one chain runs: a residual body's two (conv -> BatchNorm
/// -> ReLU -> conv -> BatchNorm), bounded so that what a chain's backward computes ahead of the
/// layers that own it, and leaves in their memos, stays within a block.
inline constexpr int chained_layers = 2;

/// A Linear's (conv2d: a Conv2d's) recipe, to chain after the recipe of its input.
inline producer_recipe layer_recipe(producer_recipe::kind what, const conv2d_params& params = {}) {
  producer_recipe recipe;
  recipe.what = what;
  recipe.convolution = params;
  return recipe;
}

/// A Linear's or Conv2d's forward on a recomputed input: `apply(recomputable)` runs its function.
/// Where computing the input runs fewer than `chained_layers` layers on recomputed inputs, its
/// output is marked as `layer` chained after the input, the function and the chain sharing a memo
/// of the input (a producer's backward that recomputes this output leaves the input for the
/// layer's, so backward runs the layer's forward once for the layers reading the producer's
/// output). The mark holds nothing: only a producer with recompute_layers on keeps none of its
/// input for it (a layer with recompute_layers, a dropit ReLU or a checkpoint reading it recompute
/// through it).
template <class Apply>
at::Tensor layer_on_recomputed_input(const recomputable_input& recomputable, producer_recipe layer,
                                     const at::Tensor& weight, const at::Tensor& bias,
                                     Apply apply) {
  const bool offered = recomputable.recipe.layers_on_recomputed_inputs() < chained_layers;
  const recomputable_input saved = offered ? with_memo(recomputable) : recomputable;
  at::Tensor output = apply(saved);
  if (offered) mark_recomputable(output, chained(std::move(layer), {weight, bias}, saved));
  return output;
}

/// The recipe of `input` when a producer reading it should keep none of it: `recompute_layers` on
/// and `input` an output recomputable through a layer (which holds nothing of it either).
inline std::optional<recomputable_input> input_through_layer(bool recompute_layers,
                                                             const at::Tensor& input) {
  if (!recompute_layers) return std::nullopt;
  auto recomputable = recipe_of(input, /*through_layers=*/true);
  if (recomputable && recomputable->recipe.runs_layer()) return recomputable;
  return std::nullopt;
}

/// A producer's forward (`call.recipe` says which) on an input recomputable through a layer: it
/// keeps none of its input, and its output is marked as its recipe chained after the input's.
inline at::Tensor produce_recomputing_input(const producer_call& call, const at::Tensor& input,
                                            const at::Tensor& weight, const at::Tensor& bias,
                                            const recomputable_input& recomputable) {
  const recomputable_input remembered = with_memo(recomputable);
  const ::torch::autograd::variable_list outputs = RecomputedInputProducerFunction::apply(
      input, compat::optional_argument(weight, input), compat::optional_argument(bias, input), call,
      remembered);
  // The recipe's sources after its input, as `producer_recipe::compute` reads them.
  std::vector<at::Tensor> parameters;
  if (call.recipe.what == producer_recipe::kind::layer_norm) parameters = {weight, bias};
  if (call.recipe.what == producer_recipe::kind::batch_norm) {
    parameters = {weight, bias};
    if (call.recipe.batch_statistics)
      parameters.insert(parameters.end(), {outputs[1], outputs[2]});
    else
      parameters.insert(parameters.end(), {call.running_mean, call.running_var});
  }
  mark_recomputable(outputs[0], chained(call.recipe, std::move(parameters), remembered));
  return outputs[0];
}

/// The forward of a producer whose sources are its input, then its weight and bias if it has
/// them (LayerNorm, GELU, SiLU): marked as recomputable from them, or, with `recompute_layers` and
/// an input recomputable through a layer, keeping none of that input.
inline at::Tensor produce(producer_recipe recipe, const std::vector<at::Tensor>& sources,
                          bool recompute_layers) {
  if (const auto through_layer = input_through_layer(recompute_layers, sources.at(0)))
    return produce_recomputing_input(producer_call(std::move(recipe)), sources[0],
                                     sources.size() > 1 ? sources[1] : at::Tensor(),
                                     sources.size() > 2 ? sources[2] : at::Tensor(),
                                     *through_layer);
  return produce(std::move(recipe), sources);
}

}  // namespace detail

}  // namespace dropit::torch
