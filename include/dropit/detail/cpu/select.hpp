#pragma once
// Exact threshold selection over 32-bit keys: which keys form the `k` largest, ties to the lower
// index. A radix histogram over the top 11 bits finds the bin holding the k-th key; only that
// bin's keys are then ordered, so the work stays linear even for one huge chunk.

#include <algorithm>
#include <array>
#include <bit>
#include <cstdint>
#include <functional>

#include "../common/keys.hpp"

namespace dropit::detail::cpu {

inline constexpr int select_radix_bits = 11;
inline constexpr int select_radix_shift = 32 - select_radix_bits;

/// Keys needed as scratch by `select_threshold` for `n` candidates.
inline std::int64_t select_scratch_keys(std::int64_t n) { return n; }

/// Counts of the top `select_radix_bits` bits of the keys, in two interleaved halves: magnitudes
/// cluster in few bins, and consecutive increments of one counter would wait on each other.
struct radix_histogram {
  static constexpr std::size_t bins = std::size_t{1} << select_radix_bits;
  std::array<std::uint32_t, 2 * bins> counts{};
  /// The highest non-empty bin: the search for the k-th key starts there rather than scanning the
  /// empty bins above (magnitudes fill a few hundred of the 2048 at most).
  std::size_t top = 0;

  radix_histogram(const std::uint32_t* keys, std::int64_t n) {
    std::uint32_t largest = 0;
    std::int64_t i = 0;
    for (; i + 1 < n; i += 2) {
      ++counts[keys[i] >> select_radix_shift];
      ++counts[bins + (keys[i + 1] >> select_radix_shift)];
      largest = std::max({largest, keys[i], keys[i + 1]});
    }
    if (i < n) {
      ++counts[keys[i] >> select_radix_shift];
      largest = std::max(largest, keys[i]);
    }
    top = largest >> select_radix_shift;
  }
  std::int64_t operator[](std::size_t bin) const {
    return std::int64_t{counts[bin]} + counts[bins + bin];
  }
};

/// Candidates up to which a partial sort of a copy beats the histogram: clearing and scanning its
/// 2 x 2048 bins costs about a microsecond, what ordering about a hundred keys costs.
inline constexpr std::int64_t small_select = 128;

/// The bin of a histogram (anything with `operator[](bin)` and `top`) that holds the k-th largest
/// key, and how many keys lie in the bins above it.
struct bin_choice {
  std::uint32_t bin = 0;
  std::int64_t above = 0;
};

template <class Histogram>
bin_choice choose_bin(const Histogram& histogram, std::int64_t k) {
  std::int64_t above = 0;
  std::size_t bin = histogram.top;
  for (;; --bin) {
    if (above + histogram[bin] >= k) break;
    above += histogram[bin];
  }
  return {static_cast<std::uint32_t>(bin), above};
}

/// Appends to `out` the keys of `keys[0, n)` in radix bin `bin`, in index order; returns how many.
inline std::int64_t collect_bin(const std::uint32_t* keys, std::int64_t n, std::uint32_t bin,
                                std::uint32_t* out) {
  std::int64_t count = 0;
  for (std::int64_t word = 0; word * 32 < n; ++word) {
    // A 32-bit match mask per word vectorises; only the matches are then visited.
    const std::uint32_t* word_keys = keys + word * 32;
    const int length = static_cast<int>(std::min<std::int64_t>(32, n - word * 32));
    std::uint32_t matches = 0;
    for (int j = 0; j < length; ++j)
      matches |= static_cast<std::uint32_t>((word_keys[j] >> select_radix_shift) == bin) << j;
    for (; matches != 0; matches &= matches - 1)
      out[count++] = word_keys[std::countr_zero(matches)];
  }
  return count;
}

/// The cut keeping the `needed` largest of `candidates[0, count)` (reordered in place), where every
/// key equal to the cut is among the candidates and all candidates agree on the bits above
/// `shift`. `needed` is in [1, count].
inline threshold narrow_candidates(std::uint32_t* candidates, std::int64_t count,
                                   std::int64_t needed, int shift = select_radix_shift) {
  // Further radix passes over the lower bits, so the final ordering only sees a handful.
  while (shift > 0 && count > 64) {
    const int bits = std::min(shift, 8);
    shift -= bits;
    const std::uint32_t digit_mask = (1u << bits) - 1;
    std::array<std::int64_t, 256> sub_histogram{};
    for (std::int64_t j = 0; j < count; ++j) ++sub_histogram[(candidates[j] >> shift) & digit_mask];
    std::uint32_t digit = digit_mask;
    while (sub_histogram[digit] < needed) needed -= sub_histogram[digit--];
    std::int64_t kept = 0;
    for (std::int64_t j = 0; j < count; ++j)
      if (((candidates[j] >> shift) & digit_mask) == digit) candidates[kept++] = candidates[j];
    count = kept;
  }
  std::nth_element(candidates, candidates + (needed - 1), candidates + count,
                   std::greater<std::uint32_t>());
  const std::uint32_t cut = candidates[needed - 1];
  // candidates[0, needed-1) are >= cut and hold every remaining candidate above it.
  std::int64_t strictly_above = 0;
  for (std::int64_t j = 0; j < needed - 1; ++j) strictly_above += candidates[j] > cut;
  return {cut, needed - strictly_above};
}

/// The cut that keeps exactly `k` of `keys[0, n)`. `scratch` holds `select_scratch_keys(n)` keys.
inline threshold select_threshold(const std::uint32_t* keys, std::int64_t n, std::int64_t k,
                                  std::uint32_t* scratch) {
  if (k <= 0) return {0xffffffffu, 0};
  if (k >= n) return {0, n};  // every key is >= 0: keep all
  if (n <= small_select) {    // no radix pass: order a copy of them all
    std::copy_n(keys, n, scratch);
    return narrow_candidates(scratch, n, k, 0);
  }
  // Counted in a pass of its own: the key loops of the callers vectorise, the counting cannot.
  const radix_histogram histogram(keys, n);
  const bin_choice choice = choose_bin(histogram, k);
  // Only the bin's keys remain candidates (a few percent for real activations).
  const std::int64_t candidates = collect_bin(keys, n, choice.bin, scratch);
  return narrow_candidates(scratch, candidates, k - choice.above);
}

/// Calls `visit(word, bits)` for each 32-key word of `keys[0, n)`, where bit j of `bits` says
/// whether key 32 * word + j is kept under `cut`: keys above the cut, and the first `cut.ties`
/// keys equal to it.
template <class Visit>
void for_each_selected_word(const std::uint32_t* keys, std::int64_t n, threshold cut,
                            Visit&& visit) {
  std::int64_t ties_left = cut.ties;
  for (std::int64_t word = 0; word * 32 < n; ++word) {
    const std::uint32_t* k = keys + word * 32;
    const int length = static_cast<int>(std::min<std::int64_t>(32, n - word * 32));
    std::uint32_t above = 0, equal = 0;
    for (int j = 0; j < length; ++j) {
      above |= static_cast<std::uint32_t>(k[j] > cut.key) << j;
      equal |= static_cast<std::uint32_t>(k[j] == cut.key) << j;
    }
    for (; equal != 0 && ties_left > 0; --ties_left) {  // lowest indices first
      above |= equal & (0u - equal);
      equal &= equal - 1;
    }
    visit(word, above);
  }
}

/// Calls `visit(index)` for each kept key, ascending.
template <class Visit>
void for_each_selected(const std::uint32_t* keys, std::int64_t n, threshold cut, Visit&& visit) {
  for_each_selected_word(keys, n, cut, [&](std::int64_t word, std::uint32_t bits) {
    for (; bits != 0; bits &= bits - 1) visit(word * 32 + std::countr_zero(bits));
  });
}

}  // namespace dropit::detail::cpu
