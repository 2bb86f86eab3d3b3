#pragma once
/// @file
/// A memory planner for LibTorch training. Given a budget, a fraction of the activation bytes the
/// dense model holds after forward, it picks for each block of the model one tool:
///
///   keep        the block as it is (dense);
///   convert     dropit's layers inside it (`convert`): exact recomputation of inputs that cheap
///               producers can give again and of SoftmaxAttention's probabilities, a DropIT cache
///               for the rest;
///   recompute   converted, and recomputing through layers (DropitOptions::recompute_layers): a
///               producer after a layer whose input is recomputed or is the model's own
///               (BatchNorm after a convolution after BatchNorm -> ReLU or after the first
///               convolution, GELU after a Linear after LayerNorm) keeps none of its input, for
///               one more forward of that layer in backward;
///   checkpoint  the dense block run again in backward (`Checkpoint`): it holds its input only.
///
/// Bytes are measured at the allocator after the caller's own forward, with the whole model in
/// each configuration (once each); times are measured too: each block's forward (what a
/// checkpoint repeats) and the converted model's step against the dense one, interleaved. Starting
/// from every block kept, the planner repeatedly takes the change that frees the most bytes per
/// second it adds, until the model holds no more than the budget; then it undoes what the budget
/// no longer needs, most expensive first. The model is left with the plan applied.
///
///     auto plan = dropit::torch::plan_memory(*model, [&] { return loss_of(model(x), y); },
///                                            dropit::torch::PlanOptions().budget(0.5));
///     std::cout << plan;   // every block's tool, the bytes it frees and the time it adds

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <functional>
#include <iomanip>
#include <limits>
#include <map>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "../detail/common/plan_search.hpp"
#include "checkpoint.hpp"
#include "convert.hpp"
#include "memory.hpp"

namespace dropit::torch {

/// What the planner does to one block (the search is shared with the Python package's planner).
using ::dropit::block_tool;
using ::dropit::tool_name;

struct PlanOptions {
  /// Activation bytes the model may hold after forward, as a fraction of what it holds dense, in
  /// (0, 1].
  TORCH_ARG(double, budget) = 0.5;
  /// How a block the planner converts is converted (skip_first and exclude count from the root).
  TORCH_ARG(ConvertOptions, convert) = ConvertOptions().relu(true);
  /// Qualified names of the Sequentials whose children are the blocks. Empty: the root's children
  /// if the root is a Sequential, else every Sequential among the root's children.
  TORCH_ARG(std::vector<std::string>, containers) = {};
  /// Timed repetitions: forwards of each block, and steps of the converted model beside dense
  /// ones (the final plan's too).
  TORCH_ARG(int, timing_rounds) = 7;
};

/// One block in a plan: the tool chosen, and what each tool did with this block changed.
struct BlockPlan {
  std::string name;
  block_tool tool = block_tool::keep;
  /// Per tool (indexed by block_tool): bytes held after forward it frees with this block alone
  /// changed (measured; recompute: what converting frees so, and what recomputing through layers
  /// frees beyond converting with every other block converted, since the layer a producer
  /// recomputes may lie in the block before), seconds it adds to a training step (checkpoint: the
  /// block's forward, timed; convert: this block's share, by forward time, of what converting
  /// every block adds; recompute: that, and its share of what recomputing through layers adds to
  /// converting), and whether it applies (convert needs a layer to convert; recompute, a producer
  /// that frees more than converting).
  std::array<std::int64_t, ::dropit::block_tool_count> freed_bytes{};
  std::array<double, ::dropit::block_tool_count> added_seconds{};
  std::array<bool, ::dropit::block_tool_count> available{true, false, false, true};
};

struct MemoryPlan {
  double budget = 0.0;
  /// Bytes held after forward (the loss excluded), dense and as planned.
  std::int64_t dense_held = 0, planned_held = 0;
  /// Median seconds of a training step (forward and backward), dense and as planned, timed
  /// interleaved.
  double dense_seconds = 0.0, planned_seconds = 0.0;
  /// Whether the planned model holds no more than the budget.
  bool met = false;
  std::vector<BlockPlan> blocks;
  /// What convert did inside the converted blocks.
  ConvertReport converted;
  /// What planning cost: the loss's forwards run alone (bytes of each configuration tried, once;
  /// block times), its training steps (forward and backward: one to warm up, the rest timed), and
  /// the wall-clock seconds of it all.
  int planning_forwards = 0, planning_steps = 0;
  double planning_seconds = 0.0;

  double held_ratio() const {
    return dense_held > 0 ? static_cast<double>(planned_held) / static_cast<double>(dense_held)
                          : 0.0;
  }
  double time_ratio() const { return dense_seconds > 0 ? planned_seconds / dense_seconds : 0.0; }

  friend std::ostream& operator<<(std::ostream& out, const MemoryPlan& plan) {
    const auto flags = out.flags();
    out << std::fixed << std::setprecision(3) << "memory plan for budget " << plan.budget
        << " of dense: holds " << plan.held_ratio() << "x (" << plan.planned_held << " of "
        << plan.dense_held << " B) at " << plan.time_ratio() << "x step time"
        << (plan.met ? "" : " -- budget NOT met: every block at its most frugal tool holds more")
        << "; planned in " << std::setprecision(1) << plan.planning_seconds << " s ("
        << plan.planning_forwards << " forwards, " << plan.planning_steps << " steps)"
        << std::setprecision(3);
    for (const BlockPlan& block : plan.blocks) {
      out << "\n  " << block.name << ": " << tool_name(block.tool);
      if (block.tool != block_tool::keep) {
        const auto t = static_cast<std::size_t>(block.tool);
        out << " (frees " << block.freed_bytes[t] << " B, adds " << std::setprecision(1)
            << 1e3 * block.added_seconds[t] << " ms)" << std::setprecision(3);
      }
    }
    if (!plan.converted.converted.empty() || !plan.converted.producers.empty() ||
        !plan.converted.attention.empty() || !plan.converted.attention_through_layers.empty())
      out << "\n" << plan.converted;
    out.flags(flags);
    return out;
  }
};

namespace detail {

/// A block: a slot of a Sequential, with the replacements convert makes inside it.
struct plan_block {
  ::torch::nn::SequentialImpl* container = nullptr;
  std::size_t index = 0;
  std::string name, qualified;
  ::torch::nn::AnyModule original, checkpointed;
  std::vector<replacement> replacements;
};

inline bool is_within(const std::string& qualified, const std::string& block) {
  return qualified == block || qualified.rfind(block + ".", 0) == 0;
}

/// The Sequentials whose children are the blocks, with their qualified names.
inline std::vector<std::pair<std::string, ::torch::nn::SequentialImpl*>> plan_containers(
    ::torch::nn::Module& root, const std::vector<std::string>& names) {
  std::vector<std::pair<std::string, ::torch::nn::SequentialImpl*>> found;
  if (names.empty()) {
    if (auto* sequential = dynamic_cast<::torch::nn::SequentialImpl*>(&root))
      return {{"", sequential}};
    for (const auto& child : root.named_children())
      if (auto* sequential = dynamic_cast<::torch::nn::SequentialImpl*>(child.value().get()))
        found.emplace_back(child.key(), sequential);
    dropit::detail::expect(!found.empty(), "plan_memory: ", root.name(),
                           " has no torch::nn::Sequential among its children; name the "
                           "Sequentials that hold the blocks in PlanOptions::containers");
    return found;
  }
  const auto modules = root.named_modules();
  for (const std::string& name : names) {
    const auto* module = modules.find(name);
    dropit::detail::expect(module != nullptr, "plan_memory: the model has no module '", name,
                           "' (PlanOptions::containers)");
    auto* sequential = dynamic_cast<::torch::nn::SequentialImpl*>(module->get());
    dropit::detail::expect(sequential != nullptr, "plan_memory: '", name, "' is a ",
                           (*module)->name(),
                           ", not a torch::nn::Sequential; the blocks must be "
                           "a Sequential's children, whose slots the planner can swap");
    found.emplace_back(name, sequential);
  }
  return found;
}

inline void synchronize([[maybe_unused]] c10::Device device) {
#if DROPIT_TORCH_HAS_CUDA
  if (device.is_cuda()) c10::cuda::device_synchronize();
#endif
}

inline double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const std::size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

/// A block whose forward is timed (synchronised with the device).
class timed_block : public ::torch::nn::Module {
 public:
  timed_block(::torch::nn::AnyModule block, c10::Device device)
      : block_(std::move(block)), device_(device) {}
  at::Tensor forward(const at::Tensor& input) {
    synchronize(device_);
    const auto start = std::chrono::steady_clock::now();
    at::Tensor output = block_.forward<at::Tensor>(input);
    synchronize(device_);
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return output;
  }
  double seconds = 0.0;

 private:
  ::torch::nn::AnyModule block_;
  c10::Device device_;
};

/// Measures the caller's training step on the model in any configuration of tools.
class plan_bench {
 public:
  plan_bench(::torch::nn::Module& root, std::vector<plan_block>& blocks,
             std::function<at::Tensor()> loss, c10::Device device, int rounds)
      : root_(root), blocks_(blocks), loss_(std::move(loss)), device_(device), rounds_(rounds) {}

  void apply(const std::vector<block_tool>& tools) {
    for (std::size_t b = 0; b < blocks_.size(); ++b) {
      plan_block& block = blocks_[b];
      if (tools[b] == block_tool::checkpoint && block.checkpointed.is_empty())
        block.checkpointed = ::torch::nn::AnyModule(Checkpoint(block.original));
      install(*block.container, block.index, block.name,
              tools[b] == block_tool::checkpoint ? block.checkpointed : block.original);
      // Then the layers inside: converted, or torch's again (a block that is one layer is its own
      // replacement, and its slot is set above unless converted).
      const bool converted = tools[b] == block_tool::convert || tools[b] == block_tool::recompute;
      for (const replacement& r : block.replacements) {
        const bool is_slot = r.container == block.container && r.index == block.index;
        if (converted) {
          set_recompute_layers(*r.replaced.ptr(), tools[b] == block_tool::recompute);
          install(*r.container, r.index, r.name, r.replaced);
        } else if (!is_slot) {
          install(*r.container, r.index, r.name, r.original);
        }
      }
    }
  }

  /// Bytes the graph holds after the loss's forward (the loss itself excluded), measured once per
  /// configuration (the allocator's count does not vary between forwards). The graph is dropped
  /// unused: a backward would free nothing more and cost about twice the forward.
  std::int64_t held(const std::vector<block_tool>& tools) {
    if (const auto known = held_bytes_.find(tools); known != held_bytes_.end())
      return known->second;
    apply(tools);
    root_.zero_grad(/*set_to_none=*/true);
    const MemoryMeter meter(device_);
    const std::int64_t base = meter.current();
    std::int64_t bytes = 0;
    {
      const at::Tensor value = loss();
      bytes = meter.current() - base - static_cast<std::int64_t>(value.nbytes());
    }
    held_bytes_.emplace(tools, bytes);
    return bytes;
  }

  /// Median seconds of each block's forward in the dense model, during the loss's forward.
  std::vector<double> forward_seconds() {
    apply(std::vector<block_tool>(blocks_.size(), block_tool::keep));
    std::vector<std::shared_ptr<timed_block>> timers;
    for (plan_block& block : blocks_) {
      timers.push_back(std::make_shared<timed_block>(block.original, device_));
      install(*block.container, block.index, block.name, ::torch::nn::AnyModule(timers.back()));
    }
    std::vector<std::vector<double>> seconds(blocks_.size());
    for (int round = 0; round < rounds_; ++round) {
      for (auto& timer : timers) timer->seconds = 0.0;
      root_.zero_grad(/*set_to_none=*/true);
      loss();  // the graph is dropped unused
      for (std::size_t b = 0; b < blocks_.size(); ++b) seconds[b].push_back(timers[b]->seconds);
    }
    std::vector<double> medians;
    for (std::size_t b = 0; b < blocks_.size(); ++b) {
      install(*blocks_[b].container, blocks_[b].index, blocks_[b].name, blocks_[b].original);
      medians.push_back(median(seconds[b]));
    }
    return medians;
  }

  /// One training step of `tools`, untimed: allocations and kernels' first-call set-up.
  void warm_up(const std::vector<block_tool>& tools) {
    apply(tools);
    step_seconds();
  }

  /// The loss's forwards run alone (bytes, block times) and its training steps so far.
  int forwards() const { return loss_calls_ - steps_; }
  int steps() const { return steps_; }

  /// Median seconds of the `baseline` step (dense by default) and median ratio of `tools`'s step
  /// to it, timed in alternation.
  std::pair<double, double> time(const std::vector<block_tool>& tools,
                                 std::vector<block_tool> baseline = {}) {
    if (baseline.empty()) baseline.assign(blocks_.size(), block_tool::keep);
    std::vector<double> baseline_seconds, ratios;
    for (int round = 0; round < rounds_; ++round) {
      apply(baseline);
      const double base = step_seconds();
      apply(tools);
      ratios.push_back(step_seconds() / base);
      baseline_seconds.push_back(base);
    }
    return {median(baseline_seconds), median(ratios)};
  }

 private:
  /// The caller's loss, checked: a scalar that requires gradients.
  at::Tensor loss() {
    ++loss_calls_;
    at::Tensor value = loss_();
    dropit::detail::expect(value.defined() && value.requires_grad(),
                           "plan_memory: the loss function returned ",
                           value.defined() ? "a tensor that requires no gradient" : "no tensor",
                           "; expected the training loss of the model");
    dropit::detail::expect(value.numel() == 1, "plan_memory: the loss has ", value.numel(),
                           " elements; expected a scalar");
    return value;
  }

  double step_seconds() {
    root_.zero_grad(/*set_to_none=*/true);
    synchronize(device_);
    const auto start = std::chrono::steady_clock::now();
    loss().backward();
    ++steps_;
    synchronize(device_);
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }

  ::torch::nn::Module& root_;
  std::vector<plan_block>& blocks_;
  std::function<at::Tensor()> loss_;
  c10::Device device_;
  int rounds_;
  std::map<std::vector<block_tool>, std::int64_t> held_bytes_;
  int loss_calls_ = 0, steps_ = 0;  // a step is one of the calls, with its backward
};

inline std::size_t index_of(block_tool tool) { return static_cast<std::size_t>(tool); }

/// The planner's measurements and search (plan_memory's steps), filling a MemoryPlan.
class planner {
 public:
  planner(plan_bench& bench, const std::vector<plan_block>& blocks, MemoryPlan& plan)
      : bench_(bench), blocks_(blocks), plan_(plan) {
    plan_.blocks.resize(blocks_.size());
    for (std::size_t b = 0; b < blocks_.size(); ++b) {
      plan_.blocks[b].name = blocks_[b].qualified;
      plan_.blocks[b].available[index_of(block_tool::convert)] = !blocks_[b].replacements.empty();
    }
  }

  /// The dense model's bytes and step time; each tool's bytes with its block changed (measured;
  /// see BlockPlan::freed_bytes) and the time it adds. Differences of whole steps are too noisy for
  /// a single block's share (a few percent of a step), so: a checkpoint costs its block's forward
  /// once more, timed block by block; converting costs what converting every block costs, timed
  /// against dense steps, shared among the blocks in proportion to their forward time; recomputing
  /// through layers, that and its share, the same way, of what it adds to converting every block
  /// (timed against converted steps).
  void measure_tools() {
    const std::vector<block_tool> dense(blocks_.size(), block_tool::keep);
    bench_.warm_up(dense);
    plan_.dense_held = bench_.held(dense);
    const std::vector<double> forward_seconds = bench_.forward_seconds();
    std::vector<block_tool> convert_all = dense;
    for (std::size_t b = 0; b < blocks_.size(); ++b)
      if (available(b, block_tool::convert)) convert_all[b] = block_tool::convert;
    const std::int64_t convert_all_held = bench_.held(convert_all);
    for (std::size_t b = 0; b < blocks_.size(); ++b) {
      BlockPlan& block = plan_.blocks[b];
      for (const block_tool tool : {block_tool::convert, block_tool::checkpoint}) {
        if (!available(b, tool)) continue;
        std::vector<block_tool> alone = dense;
        alone[b] = tool;
        block.freed_bytes[index_of(tool)] = plan_.dense_held - bench_.held(alone);
      }
      // Recomputing through layers applies where, every other block converted, it frees more
      // than converting.
      if (!available(b, block_tool::convert)) continue;
      std::vector<block_tool> recomputed = convert_all;
      recomputed[b] = block_tool::recompute;
      const std::int64_t beyond_converting = convert_all_held - bench_.held(recomputed);
      block.available[index_of(block_tool::recompute)] = beyond_converting > 0;
      block.freed_bytes[index_of(block_tool::recompute)] =
          block.freed_bytes[index_of(block_tool::convert)] + beyond_converting;
    }

    std::vector<block_tool> recompute_all = convert_all;
    double convertible_forward = 0.0, recomputable_forward = 0.0;
    for (std::size_t b = 0; b < blocks_.size(); ++b) {
      if (available(b, block_tool::convert)) convertible_forward += forward_seconds[b];
      if (available(b, block_tool::recompute)) {
        recompute_all[b] = block_tool::recompute;
        recomputable_forward += forward_seconds[b];
      }
    }
    const auto [dense_seconds, convert_ratio] = bench_.time(convert_all);
    plan_.dense_seconds = dense_seconds;
    const double convert_seconds = std::max(0.0, convert_ratio - 1.0) * dense_seconds;
    // Against converted steps, not as a second ratio to dense: one ratio of two close steps
    // rather than the difference of two noisy ones.
    double recompute_seconds = 0.0;
    if (recomputable_forward > 0.0) {
      const auto [convert_step, recompute_ratio] = bench_.time(recompute_all, convert_all);
      recompute_seconds = std::max(0.0, recompute_ratio - 1.0) * convert_step;
    }
    for (std::size_t b = 0; b < blocks_.size(); ++b) {
      BlockPlan& block = plan_.blocks[b];
      block.added_seconds[index_of(block_tool::checkpoint)] = forward_seconds[b];
      if (available(b, block_tool::convert) && convertible_forward > 0.0)
        block.added_seconds[index_of(block_tool::convert)] =
            convert_seconds * forward_seconds[b] / convertible_forward;
      if (available(b, block_tool::recompute))
        block.added_seconds[index_of(block_tool::recompute)] =
            block.added_seconds[index_of(block_tool::convert)] +
            recompute_seconds * forward_seconds[b] / recomputable_forward;
    }
  }

  /// The tools, by the shared search (detail/common/plan_search.hpp) over the measured costs, with
  /// the bytes of every configuration it tries measured on the caller's step.
  std::vector<block_tool> search() {
    std::vector<dropit::detail::block_costs> costs;
    for (const BlockPlan& block : plan_.blocks)
      costs.push_back({block.available, block.added_seconds});
    dropit::detail::plan_search search(
        std::move(costs), plan_.dense_held, plan_.dense_seconds, plan_.budget,
        [&](const std::vector<block_tool>& tools) { return bench_.held(tools); });
    const std::vector<block_tool> tools = search.run();
    plan_.met = search.met();
    for (std::size_t b = 0; b < blocks_.size(); ++b) plan_.blocks[b].tool = tools[b];
    return tools;
  }

 private:
  bool available(std::size_t b, block_tool tool) const {
    return plan_.blocks[b].available[index_of(tool)];
  }

  plan_bench& bench_;
  const std::vector<plan_block>& blocks_;
  MemoryPlan& plan_;
};

}  // namespace detail

/// Wraps every child of `blocks` in a Checkpoint: per-block checkpointing, which holds each
/// block's input only (the plan with every block checkpointed).
inline void checkpoint_each(::torch::nn::SequentialImpl& blocks) {
  std::size_t index = 0;
  for (const auto& child : blocks.named_children()) {
    const ::torch::nn::AnyModule block = *(blocks.begin() + static_cast<std::ptrdiff_t>(index));
    detail::install(blocks, index++, child.key(), ::torch::nn::AnyModule(Checkpoint(block)));
  }
}

/// Plans and applies, in place, one tool per block so that `root` holds no more than
/// `options.budget()` of its dense activation bytes after forward, at the least measured step
/// time. `loss` runs one forward of the model on a representative batch and returns the scalar
/// loss; the planner calls it once for each configuration of tools it measures (up to a few
/// hundred forwards, whose graphs it drops unused) and steps (forward and backward) up to
/// 1 + 6 × timing_rounds times; the plan reports both. The blocks' buffers (BatchNorm's running
/// statistics) are restored afterwards and the parameters' gradients cleared; random generators
/// advance. Should the loss throw, the model is left as it came. Call it on a model in training
/// mode, before building its optimizer or after (parameters are not replaced: converted layers
/// and checkpoints share them).
inline MemoryPlan plan_memory(::torch::nn::Module& root, const std::function<at::Tensor()>& loss,
                              const PlanOptions& options = {}) {
  const double budget = options.budget();
  dropit::detail::expect(budget > 0.0 && budget <= 1.0, "plan_memory: budget ", budget,
                         " is outside (0, 1]; it is the fraction of the dense model's activation "
                         "bytes the model may hold");
  dropit::detail::expect(options.timing_rounds() >= 1, "plan_memory: timing_rounds ",
                         options.timing_rounds(), " must be at least 1");
  dropit::detail::expect(static_cast<bool>(loss), "plan_memory: the loss function is empty");
  const auto parameters = root.parameters();
  dropit::detail::expect(!parameters.empty(), "plan_memory: ", root.name(),
                         " has no parameters to train");
  dropit::detail::expect(root.is_training(), "plan_memory: ", root.name(),
                         " is in eval mode; plan in training mode, where activations are kept");

  const auto planning_start = std::chrono::steady_clock::now();
  std::vector<detail::plan_block> blocks;
  for (const auto& [prefix, container] : detail::plan_containers(root, options.containers())) {
    std::size_t index = 0;
    for (const auto& child : container->named_children()) {
      detail::plan_block block;
      block.container = container;
      block.index = index;
      block.name = child.key();
      block.qualified = prefix.empty() ? child.key() : prefix + "." + child.key();
      block.original = *(container->begin() + static_cast<std::ptrdiff_t>(index++));
      blocks.push_back(std::move(block));
    }
  }
  dropit::detail::expect(!blocks.empty(), "plan_memory: the containers hold no blocks");
  for (const auto& inner : blocks)
    for (const auto& outer : blocks)
      dropit::detail::expect(
          &inner == &outer || !detail::is_within(inner.qualified, outer.qualified),
          "plan_memory: block '", inner.qualified, "' lies inside block '", outer.qualified,
          "'; name containers whose blocks do not nest");

  // Convert the whole model once, so that skip_first and exclude count as convert counts, and
  // remember each replacement with its block; the dense modules go back until the plan says.
  detail::converter converter(options.convert());
  converter.visit(root, "");
  for (auto r = converter.replacements().rbegin(); r != converter.replacements().rend(); ++r)
    detail::install(*r->container, r->index, r->name, r->original);
  for (const detail::replacement& r : converter.replacements())
    for (detail::plan_block& block : blocks)
      if (detail::is_within(r.qualified, block.qualified)) block.replacements.push_back(r);

  std::vector<std::pair<at::Tensor, at::Tensor>> buffers;
  for (const at::Tensor& buffer : root.buffers())
    if (buffer.defined()) buffers.emplace_back(buffer, buffer.clone());

  MemoryPlan plan;
  plan.budget = budget;
  detail::plan_bench bench(root, blocks, loss, parameters.front().device(),
                           options.timing_rounds());
  detail::planner planner(bench, blocks, plan);
  const auto restore_buffers = [&] {
    for (auto& [buffer, saved] : buffers) buffer.variable_data().copy_(saved);
    root.zero_grad(/*set_to_none=*/true);
  };
  std::vector<block_tool> tools;
  try {
    planner.measure_tools();
    tools = planner.search();
    plan.planned_held = bench.held(tools);
    plan.planned_seconds = bench.time(tools).second * plan.dense_seconds;
    bench.apply(tools);
  } catch (...) {  // a loss that fails: the model as it came
    bench.apply(std::vector<block_tool>(blocks.size(), block_tool::keep));
    restore_buffers();
    throw;
  }

  // What the converted blocks hold, as convert reports it.
  const ConvertReport full = converter.report();
  const auto converted_block = [&](const std::string& name) {
    for (std::size_t b = 0; b < blocks.size(); ++b)
      if ((tools[b] == block_tool::convert || tools[b] == block_tool::recompute) &&
          detail::is_within(name, blocks[b].qualified))
        return true;
    return false;
  };
  const auto within_converted = [&](const std::vector<std::string>& names) {
    std::vector<std::string> kept;
    for (const auto& name : names)
      if (converted_block(name)) kept.push_back(name);
    return kept;
  };
  plan.converted.converted = within_converted(full.converted);
  plan.converted.producers = within_converted(full.producers);
  plan.converted.attention = within_converted(full.attention);
  plan.converted.attention_through_layers = within_converted(full.attention_through_layers);
  for (const auto& skipped : full.skipped)
    if (converted_block(skipped.first)) plan.converted.skipped.push_back(skipped);

  restore_buffers();
  plan.planning_forwards = bench.forwards();
  plan.planning_steps = bench.steps();
  plan.planning_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - planning_start).count();
  return plan;
}

template <class ModuleHolder>
MemoryPlan plan_memory(ModuleHolder& root, const std::function<at::Tensor()>& loss,
                       const PlanOptions& options = {}) requires requires {
  root.ptr();
}
{ return plan_memory(*root.ptr(), loss, options); }

}  // namespace dropit::torch
