#pragma once
/// @file
/// Selection and granularity policies, composed at compile time as `policy<Selection,
/// Granularity>`, and `kept_count`, the one definition of how many of `n` candidates survive a drop
/// rate.

#include <cmath>
#include <concepts>
#include <cstdint>
#include <type_traits>

#include "config.hpp"

namespace dropit {

/// Default chunk length D of the chunked policies (the paper's "parallel min-k").
inline constexpr std::int64_t default_chunk_size = std::int64_t{1} << 14;
/// Chunk lengths are limited so an offset within a chunk fits 16 bits.
inline constexpr std::int64_t max_chunk_size = std::int64_t{1} << 16;

/// Keep `k` positions per chunk of `chunk_size` consecutive elements, uniformly without
/// replacement, drawn from a counter-based generator keyed by (seed, chunk). The positions are
/// regenerated in backward, so the cache stores values only.
struct random_selection {
  double gamma = 0.9;
  std::uint64_t seed = 0;
  std::int64_t chunk_size = default_chunk_size;
  /// Scale kept values by n/k in backward (an unbiased estimator). Off in the paper.
  bool rescale = false;
};

/// Keep the `k(n)` largest magnitudes of the whole tensor (exact top-k).
struct min_k_selection {
  double gamma = 0.9;
};

/// Keep the `k(D)` largest magnitudes of every chunk of `chunk_size` consecutive elements; a
/// shorter tail chunk keeps `k(tail)`.
struct chunked_min_k_selection {
  double gamma = 0.9;
  std::int64_t chunk_size = default_chunk_size;
};

/// Select individual elements.
struct element_granularity {};

/// Select whole channels along `axis` (negative counts from the end): 1 for NCHW activations,
/// -1 for the input of a linear layer.
struct channel_granularity {
  int axis = 1;
};

template <class S>
concept selection_policy = std::same_as<S, random_selection> || std::same_as<S, min_k_selection> ||
    std::same_as<S, chunked_min_k_selection>;

template <class G>
concept granularity_policy =
    std::same_as<G, element_granularity> || std::same_as<G, channel_granularity>;

/// A complete policy: what to keep and at which granularity.
template <selection_policy Selection, granularity_policy Granularity = element_granularity>
requires(!(std::same_as<Selection, chunked_min_k_selection> &&
           std::same_as<Granularity, channel_granularity>)) struct policy {
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

/// How many of `n` candidates are kept at drop rate `gamma` in [0, 1): n - floor(gamma * n). A
/// product within a few ulps of an integer counts as that integer, so that decimal rates which
/// binary cannot represent (0.29 * 100 = 28.999999999999996) drop exactly what they say. Never 0
/// when n > 0.
DROPIT_HOST_DEVICE constexpr std::int64_t kept_count(std::int64_t n, double gamma) {
  if (n <= 0) return 0;
  const double product = gamma * static_cast<double>(n);
  const auto below = static_cast<std::int64_t>(product);  // product >= 0: truncation is floor
  const double gap = static_cast<double>(below + 1) - product;
  const std::int64_t dropped = gap <= 4 * 2.220446049250313e-16 * product ? below + 1 : below;
  return dropped >= n ? 1 : n - dropped;  // never drop everything
}

namespace detail {

inline void validate_gamma(double gamma) {
  expect(gamma >= 0.0 && gamma < 1.0, "drop rate gamma = ", gamma, " is outside [0, 1)");
}

inline void validate_chunk_size(std::int64_t chunk_size) {
  expect(chunk_size >= 1 && chunk_size <= max_chunk_size, "chunk size D = ", chunk_size,
         " is outside [1, ", max_chunk_size, "]");
}

}  // namespace detail
}  // namespace dropit
