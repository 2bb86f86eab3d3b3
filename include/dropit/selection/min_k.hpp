#pragma once
/// @file
/// Min-k selection: the `k(n)` largest magnitudes of the whole tensor (exact top-k).

#include <cstdint>
#include <limits>

#include "../config.hpp"
#include "../detail/common/keys.hpp"
#include "chunking.hpp"
#include "traits.hpp"

namespace dropit {

/// Keep the `k(n)` largest magnitudes of the whole tensor (exact top-k).
struct min_k_selection {
  double gamma = 0.9;
};

template <>
struct selection_traits<min_k_selection> {
  static constexpr selection_kind kind = selection_kind::min_k;
  static constexpr const char* name = "min_k";
  static constexpr bool ranks_values = true;
  static constexpr bool whole_tensor = true;
  static constexpr bool supports_channels = true;

  static void validate(const min_k_selection& s) { detail::validate_gamma(s.gamma); }
  /// One chunk of the whole tensor, its offsets addressed with 16 or 32 bits.
  static std::int64_t chunk_size(const min_k_selection&, std::int64_t n) {
    detail::expect(n <= std::int64_t{std::numeric_limits<std::uint32_t>::max()}, "min-k over ", n,
                   " elements exceeds the 32-bit index range (at most ",
                   std::numeric_limits<std::uint32_t>::max(),
                   "); use chunked_min_k_selection for larger tensors");
    return n;
  }
  static std::uint64_t seed(const min_k_selection&) { return 0; }
  static bool rescale(const min_k_selection&) { return false; }
  static min_k_selection from_spec(const policy_spec& spec) { return {spec.gamma}; }

  template <class T>
  DROPIT_HOST_DEVICE static std::uint32_t key(T value, std::uint64_t, std::uint64_t,
                                              std::uint64_t) {
    return detail::magnitude_key(value);
  }
};

}  // namespace dropit
