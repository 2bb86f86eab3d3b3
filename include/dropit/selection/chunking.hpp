#pragma once
/// @file
/// `kept_count`, the one definition of how many of `n` candidates survive a drop rate, and the
/// limits of the parameters every selection shares.

#include <cstdint>

#include "../config.hpp"

namespace dropit {

/// Default chunk length D of the chunked policies (the paper's "parallel min-k").
inline constexpr std::int64_t default_chunk_size = std::int64_t{1} << 14;
/// Chunk lengths are limited so an offset within a chunk fits 16 bits.
inline constexpr std::int64_t max_chunk_size = std::int64_t{1} << 16;

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
