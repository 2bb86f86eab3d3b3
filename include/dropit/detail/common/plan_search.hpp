#pragma once
// The memory planner's search, shared by the LibTorch planner (torch/plan.hpp) and the Python
// package's (dropit.plan_memory): given, per block, the tools that apply and the seconds each adds
// to a training step, and a way to measure the bytes the model holds after forward in any
// configuration of tools, it picks one tool per block to meet a budget at the least added time.

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

namespace dropit {

/// What a memory planner does to one block: keep it dense, convert its layers (exact
/// recomputation where cheap producers allow, a DropIT cache for the rest), recompute (convert,
/// and recompute through layers too: a producer after a layer whose input is recomputed keeps
/// none of its input, for that layer's forward again in backward), or checkpoint it (run it again
/// in backward; it holds its input only). Ordered from the least frugal.
enum class block_tool : std::uint8_t { keep, convert, recompute, checkpoint };
inline constexpr std::size_t block_tool_count = 4;

inline const char* tool_name(block_tool tool) {
  switch (tool) {
    case block_tool::keep:
      return "keep";
    case block_tool::convert:
      return "convert";
    case block_tool::recompute:
      return "recompute";
    case block_tool::checkpoint:
      return "checkpoint";
  }
  return "?";
}

namespace detail {

/// What the search knows of one block, per tool (indexed by block_tool): whether it applies and
/// the seconds it adds to a training step with this block alone changed.
struct block_costs {
  std::array<bool, block_tool_count> available{true, false, false, true};
  std::array<double, block_tool_count> added_seconds{};
};

/// Bytes the model holds after forward with each block given its tool (measured, not modelled:
/// converting a block frees little alone when the block before it holds the same input anyway).
using held_bytes_of = std::function<std::int64_t(const std::vector<block_tool>&)>;

/// Starting from every block kept, repeatedly takes the change that frees the most bytes per second
/// it adds, until the model holds no more than the budget; then steps back what the budget no
/// longer needs, most expensive first. Where one change seen on the way met the budget for fewer
/// seconds in all (the last greedy step can overshoot), that plan, stepped back too, wins. The
/// changes tried are each block's other tools and every kept block converted at once (as convert
/// would). The bytes a change frees are measured in the configuration at hand; the time it adds is
/// the sum of its blocks' alone, at least a floor below a timer's noise (0.1 % of the dense step).
class plan_search {
 public:
  plan_search(std::vector<block_costs> blocks, std::int64_t dense_held, double dense_seconds,
              double budget, held_bytes_of held)
      : blocks_(std::move(blocks)),
        dense_held_(dense_held),
        dense_seconds_(dense_seconds),
        target_(budget * static_cast<double>(dense_held)),
        held_(std::move(held)) {}

  /// The tool of each block.
  std::vector<block_tool> run() {
    std::vector<block_tool> tools(blocks_.size(), block_tool::keep);
    std::int64_t held = dense_held_;
    // The cheapest single change seen that meets the budget from where the search stood: the
    // greedy step by bytes per second may overshoot where a dearer rate finishes for less.
    std::vector<block_tool> finishing;
    while (static_cast<double>(held) > target_) {
      double best_score = 0.0;
      std::int64_t best_held = held;
      std::vector<block_tool> best;
      for (const auto& change : changes_from(tools)) {
        const std::int64_t change_held = held_(change);
        const double score = static_cast<double>(held - change_held) / added_cost(tools, change);
        if (change_held < held && score > best_score) {
          best_score = score;
          best_held = change_held;
          best = change;
        }
        if (static_cast<double>(change_held) <= target_ &&
            (finishing.empty() || total_seconds(change) < total_seconds(finishing)))
          finishing = change;
      }
      if (best.empty()) break;  // nothing left that frees more
      tools = std::move(best);
      held = best_held;
    }
    met_ = static_cast<double>(held) <= target_;
    if (!met_) return tools;
    step_back(tools);
    if (!finishing.empty()) {
      step_back(finishing);
      if (total_seconds(finishing) < total_seconds(tools)) return finishing;
    }
    return tools;
  }

  /// Whether the tools run() returned hold no more than the budget.
  bool met() const { return met_; }

 private:
  bool available(std::size_t b, block_tool tool) const {
    return blocks_[b].available[static_cast<std::size_t>(tool)];
  }
  double seconds(std::size_t b, block_tool tool) const {
    return blocks_[b].added_seconds[static_cast<std::size_t>(tool)];
  }

  double total_seconds(const std::vector<block_tool>& tools) const {
    double total = 0.0;
    for (std::size_t b = 0; b < blocks_.size(); ++b) total += seconds(b, tools[b]);
    return total;
  }

  double added_cost(const std::vector<block_tool>& from, const std::vector<block_tool>& to) const {
    double cost = 0.0;
    for (std::size_t b = 0; b < blocks_.size(); ++b)
      cost += seconds(b, to[b]) - seconds(b, from[b]);
    return std::max(cost, 1e-3 * dense_seconds_);
  }

  std::vector<std::vector<block_tool>> changes_from(const std::vector<block_tool>& tools) const {
    std::vector<std::vector<block_tool>> changes;
    std::vector<block_tool> convert_kept = tools;
    std::size_t newly_converted = 0;
    for (std::size_t b = 0; b < blocks_.size(); ++b) {
      for (const block_tool tool :
           {block_tool::convert, block_tool::recompute, block_tool::checkpoint}) {
        if (tool == tools[b] || !available(b, tool)) continue;
        changes.push_back(tools);
        changes.back()[b] = tool;
      }
      if (tools[b] == block_tool::keep && available(b, block_tool::convert)) {
        convert_kept[b] = block_tool::convert;
        ++newly_converted;
      }
    }
    if (newly_converted > 1) changes.push_back(convert_kept);
    return changes;
  }

  /// The most expensive choices first, each stepped down to a tool before it (keep, convert,
  /// recompute, checkpoint) that costs less, while the whole model still meets the budget.
  void step_back(std::vector<block_tool>& tools) const {
    std::vector<std::size_t> order(blocks_.size());
    for (std::size_t b = 0; b < order.size(); ++b) order[b] = b;
    std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
      return seconds(a, tools[a]) > seconds(b, tools[b]);
    });
    for (const std::size_t b : order)
      for (const block_tool cheaper :
           {block_tool::keep, block_tool::convert, block_tool::recompute}) {
        if (cheaper >= tools[b] || !available(b, cheaper) ||
            seconds(b, cheaper) >= seconds(b, tools[b]))
          continue;
        std::vector<block_tool> trial = tools;
        trial[b] = cheaper;
        if (static_cast<double>(held_(trial)) <= target_) {
          tools = std::move(trial);
          break;
        }
      }
  }

  std::vector<block_costs> blocks_;
  std::int64_t dense_held_;
  double dense_seconds_;
  double target_;
  held_bytes_of held_;
  bool met_ = false;
};

}  // namespace detail
}  // namespace dropit
