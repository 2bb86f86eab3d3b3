#pragma once
/// @file
/// Random selection: `k` positions per chunk drawn uniformly without replacement from a
/// counter-based generator keyed by (seed, chunk). Backward regenerates the positions, so the cache
/// stores values only.

#include <cstdint>

#include "../config.hpp"
#include "../detail/common/keys.hpp"
#include "chunking.hpp"
#include "traits.hpp"

namespace dropit {

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

template <>
struct selection_traits<random_selection> {
  static constexpr selection_kind kind = selection_kind::random;
  static constexpr const char* name = "random";
  static constexpr bool ranks_values = false;
  static constexpr bool whole_tensor = false;
  static constexpr bool supports_channels = true;

  static void validate(const random_selection& s) { detail::validate_gamma(s.gamma); }
  /// Chunk lengths are checked only where chunks are used (element granularity).
  static std::int64_t chunk_size(const random_selection& s, std::int64_t) {
    detail::validate_chunk_size(s.chunk_size);
    return s.chunk_size;
  }
  static std::uint64_t seed(const random_selection& s) { return s.seed; }
  static bool rescale(const random_selection& s) { return s.rescale; }
  static random_selection from_spec(const policy_spec& spec) {
    return {spec.gamma, spec.seed, spec.chunk_size, spec.rescale};
  }

  /// A generator draw; the value is not read.
  template <class T>
  DROPIT_HOST_DEVICE static std::uint32_t key(T, std::uint64_t seed, std::uint64_t stream,
                                              std::uint64_t index) {
    return detail::random_key(seed, stream, index);
  }
};

}  // namespace dropit
