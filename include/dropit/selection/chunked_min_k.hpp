#pragma once
/// @file
/// Chunked min-k selection (the paper's "parallel min-k"): the `k(D)` largest magnitudes of every
/// chunk of `D` consecutive elements.

#include <cstdint>

#include "../config.hpp"
#include "../detail/common/keys.hpp"
#include "chunking.hpp"
#include "traits.hpp"

namespace dropit {

/// Keep the `k(D)` largest magnitudes of every chunk of `chunk_size` consecutive elements; a
/// shorter tail chunk keeps `k(tail)`.
struct chunked_min_k_selection {
  double gamma = 0.9;
  std::int64_t chunk_size = default_chunk_size;
};

template <>
struct selection_traits<chunked_min_k_selection> {
  static constexpr selection_kind kind = selection_kind::chunked_min_k;
  static constexpr const char* name = "chunked_min_k";
  static constexpr bool ranks_values = true;
  static constexpr bool whole_tensor = false;
  static constexpr bool supports_channels = false;

  static void validate(const chunked_min_k_selection& s) { detail::validate_gamma(s.gamma); }
  /// Chunk lengths are checked only where chunks are used (element granularity).
  static std::int64_t chunk_size(const chunked_min_k_selection& s, std::int64_t) {
    detail::validate_chunk_size(s.chunk_size);
    return s.chunk_size;
  }
  static std::uint64_t seed(const chunked_min_k_selection&) { return 0; }
  static bool rescale(const chunked_min_k_selection&) { return false; }
  static chunked_min_k_selection from_spec(const policy_spec& spec) {
    return {spec.gamma, spec.chunk_size};
  }

  template <class T>
  DROPIT_HOST_DEVICE static std::uint32_t key(T value, std::uint64_t, std::uint64_t,
                                              std::uint64_t) {
    return detail::magnitude_key(value);
  }
};

}  // namespace dropit
