#pragma once
// Exact threshold selection over 32-bit keys: which keys form the `k` largest, ties to the lower
// index. A radix histogram over the top 11 bits finds the bin holding the k-th key; only that
// bin's keys are then ordered, so the work stays linear even for one huge chunk.

#include <algorithm>
#include <array>
#include <cstdint>
#include <functional>

#include "../common/keys.hpp"

namespace dropit::detail::cpu {

inline constexpr int select_radix_bits = 11;
inline constexpr int select_radix_shift = 32 - select_radix_bits;

/// Keys needed as scratch by `select_threshold` for `n` candidates.
inline std::int64_t select_scratch_keys(std::int64_t n) { return n; }

/// The cut that keeps exactly `k` of `keys[0, n)`. `scratch` holds `select_scratch_keys(n)` keys.
inline threshold select_threshold(const std::uint32_t* keys, std::int64_t n, std::int64_t k,
                                  std::uint32_t* scratch) {
  if (k <= 0) return {0xffffffffu, 0};
  if (k >= n) return {0, n};  // every key is >= 0: keep all

  std::array<std::int64_t, std::size_t{1} << select_radix_bits> histogram{};
  for (std::int64_t i = 0; i < n; ++i) ++histogram[keys[i] >> select_radix_shift];

  std::int64_t above = 0;  // keys in bins above the one holding the k-th largest
  std::uint32_t bin = histogram.size() - 1;
  while (above + histogram[bin] < k) above += histogram[bin--];

  std::int64_t candidates = 0;
  for (std::int64_t i = 0; i < n; ++i)
    if ((keys[i] >> select_radix_shift) == bin) scratch[candidates++] = keys[i];

  const std::int64_t needed = k - above;  // in [1, candidates]
  std::nth_element(scratch, scratch + (needed - 1), scratch + candidates,
                   std::greater<std::uint32_t>());
  const std::uint32_t cut = scratch[needed - 1];
  // scratch[0, needed-1) are >= cut; count those strictly above it.
  std::int64_t strictly_above = 0;
  for (std::int64_t i = 0; i < needed - 1; ++i) strictly_above += scratch[i] > cut;
  return {cut, needed - strictly_above};
}

}  // namespace dropit::detail::cpu
