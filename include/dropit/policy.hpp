#pragma once
/// @file
/// Selection and granularity policies, composed at compile time as `policy<Selection,
/// Granularity>`, and `kept_count`, the one definition of how many of `n` candidates survive a drop
/// rate.
///
/// Each selection lives in its own header under selection/ with its `selection_traits`
/// specialisation; `selection_policies` below lists them for the run-time dispatch.

#include <concepts>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>

#include "config.hpp"
#include "selection/chunked_min_k.hpp"
#include "selection/chunking.hpp"
#include "selection/min_k.hpp"
#include "selection/random.hpp"
#include "selection/traits.hpp"

namespace dropit {

/// Every selection policy, for the dispatch from a run-time `selection_kind`.
using selection_policies =
    selection_list<random_selection, min_k_selection, chunked_min_k_selection>;

/// Calls `visit(std::type_identity<S>{})` with the selection policy whose kind is `kind`.
template <class Visit>
decltype(auto) visit_selection(selection_kind kind, Visit&& visit) {
  return detail::visit_selection_in(selection_policies{}, kind, std::forward<Visit>(visit));
}

/// Whether `kind` is the kind of one of `selection_policies`.
constexpr bool is_known_selection(selection_kind kind) {
  return []<class... S>(selection_list<S...>, selection_kind k) {
    return ((k == selection_traits<S>::kind) || ...);
  }(selection_policies{}, kind);
}

/// The known selections as "name (kind), ...", for error messages.
inline const std::string& known_selections() {
  // Built once: checks pass it to every message they might raise.
  static const std::string names = [] {
    std::string list;
    [&]<class... S>(selection_list<S...>) {
      ((list += (list.empty() ? "" : ", ") + std::string(selection_traits<S>::name) + " (" +
                std::to_string(static_cast<int>(selection_traits<S>::kind)) + ")"),
       ...);
    }(selection_policies{});
    return list;
  }();
  return names;
}

/// Select individual elements.
struct element_granularity {};

/// Select whole channels along `axis` (negative counts from the end): 1 for NCHW activations,
/// -1 for the input of a linear layer.
struct channel_granularity {
  int axis = 1;
};

template <class S>
concept selection_policy = requires {
  { selection_traits<S>::kind } -> std::convertible_to<selection_kind>;
};

template <class G>
concept granularity_policy =
    std::same_as<G, element_granularity> || std::same_as<G, channel_granularity>;

/// A complete policy: what to keep and at which granularity.
template <selection_policy Selection, granularity_policy Granularity = element_granularity>
requires(selection_traits<Selection>::supports_channels ||
         !std::same_as<Granularity, channel_granularity>) struct policy {
  using selection_type = Selection;
  using granularity_type = Granularity;
  Selection selection{};
  Granularity granularity{};
};

template <class P>
concept policy_type = requires {
  typename P::selection_type;
  typename P::granularity_type;
}
&&std::same_as<P, policy<typename P::selection_type, typename P::granularity_type>>;

}  // namespace dropit
