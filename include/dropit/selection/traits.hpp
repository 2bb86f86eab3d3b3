#pragma once
/// @file
/// What the library knows of a selection policy, all from one trait: `selection_traits<S>`,
/// specialised in the selection's own header (selection/<name>.hpp). Every part of the library
/// that depends on the selection reads it: `plan_cache` (validation, chunking, encoding),
/// `visit_policy` and `policy_spec` (the run-time form), and the CPU and CUDA selection paths (the
/// key of each candidate). A specialisation provides:
///
// clang-format off
/// | member                            | meaning                                                   |
/// |-----------------------------------|-----------------------------------------------------------|
/// | `kind`, `name`                    | run-time tag stored in a cache layout; its name           |
/// | `ranks_values`                    | true: keys come from the values, positions are stored;    |
/// |                                   | false: keys are generator draws, regenerated in backward  |
/// | `whole_tensor`                    | one chunk of the whole tensor, or chunks of `D`           |
/// | `supports_channels`               | usable with channel granularity                           |
/// | `validate(s)`                     | throws `dropit::error` on bad parameters (D aside)        |
/// | `chunk_size(s, n)`                | the checked chunk length D for `n` elements               |
/// | `seed(s)`, `rescale(s)`           | generator seed and n/k rescaling (0 and false if unused)  |
/// | `from_spec(spec)`                 | the selection a `policy_spec` describes                   |
/// | `key(value, seed, stream, index)` | the candidate's 32-bit key, host and device: the `k`      |
/// |                                   | largest keys are kept, ties to the lower index            |
///
/// A new selection is one header like selection/random.hpp (the struct and its traits) plus its
/// tests; its kind is added to `selection_kind` below and its type to `selection_policies` in
/// policy.hpp.
// clang-format on

#include <cstdint>
#include <type_traits>
#include <utility>

#include "../config.hpp"
#include "chunking.hpp"

namespace dropit {

/// Run-time tag of a selection, stored in every cache layout.
enum class selection_kind : std::uint8_t { random, min_k, chunked_min_k };

/// Specialised by each selection policy (see the table above).
template <class Selection>
struct selection_traits;

/// A policy chosen at run time (from a command line or a layer's options). `plan_cache` turns it
/// into the same layout as the matching `policy<...>`. Fields a selection does not use are
/// ignored.
struct policy_spec {
  selection_kind selection = selection_kind::chunked_min_k;
  bool channel_granularity = false;
  int channel_axis = 1;
  double gamma = 0.9;
  std::int64_t chunk_size = default_chunk_size;
  std::uint64_t seed = 0;
  bool rescale = false;
};

template <class... Selections>
struct selection_list {};

namespace detail {

template <class F, class Selection, class... Rest>
decltype(auto) visit_selection_in(selection_list<Selection, Rest...>, selection_kind kind,
                                  F&& visit) {
  if constexpr (sizeof...(Rest) == 0) {
    expect(kind == selection_traits<Selection>::kind, "unknown selection kind ",
           static_cast<int>(kind));
    return visit(std::type_identity<Selection>{});
  } else {
    if (kind == selection_traits<Selection>::kind) return visit(std::type_identity<Selection>{});
    return visit_selection_in(selection_list<Rest...>{}, kind, std::forward<F>(visit));
  }
}

}  // namespace detail
}  // namespace dropit
