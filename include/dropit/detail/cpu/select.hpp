#pragma once
// Exact threshold selection over 32-bit keys: which keys form the `k` largest, ties to the lower
// index. A bracket of key values that holds the k-th key is found first: from a sample of the
// keys for long inputs, else from a radix histogram over the top 11 bits. One branch-free pass
// then counts the keys above the bracket and gathers those inside it, and only those are ordered,
// so the work stays linear even for one huge chunk.

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <functional>

#include "../common/keys.hpp"
#include "simd.hpp"

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

  /// The histogram of every `stride`-th key of `keys[0, n)`.
  radix_histogram(const std::uint32_t* keys, std::int64_t n, std::int64_t stride = 1) {
    std::uint32_t largest = 0;
    std::int64_t i = 0;
    for (; i + stride < n; i += 2 * stride) {
      ++counts[keys[i] >> select_radix_shift];
      ++counts[bins + (keys[i + stride] >> select_radix_shift)];
      largest = std::max({largest, keys[i], keys[i + stride]});
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

/// Candidates up to which a selection in a copy (std::nth_element) is used: its work grows with
/// the keys alone, where the histogram clears and scans 2 x 2048 bins (16 KiB) whatever their
/// number.
inline constexpr std::int64_t small_select = 512;

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

/// Keys whose indices the branch-free compaction (`append_set_bits`) gathers at a time: their
/// indices fit a buffer on the stack, relative to the block's first key.
inline constexpr std::int64_t compaction_block = 2048;

/// Calls `visit(first, indices, count)` for each block of `compaction_block` keys from `first`,
/// where `indices[0, count)` are the ascending indices (from `first`) of the block's keys whose bit
/// is set in `bits_of(word, length)`: the bits of the `length` (32 but in the last word) keys of
/// mask word `word`.
template <class BitsOf, class Visit>
DROPIT_ALWAYS_INLINE void for_each_compacted_block(std::int64_t n, BitsOf&& bits_of,
                                                   Visit&& visit) {
  std::uint32_t indices[compaction_block];
  for (std::int64_t first = 0; first < n; first += compaction_block) {
    const std::int64_t length = std::min(compaction_block, n - first);
    std::int64_t count = 0;
    for (std::int64_t offset = 0; offset < length; offset += 32) {
      const int word_length = static_cast<int>(std::min<std::int64_t>(32, length - offset));
      std::uint32_t bits = bits_of((first + offset) / 32, word_length);
      const auto word_first = static_cast<std::uint32_t>(offset);
      if (word_length == 32) {  // writes stay below indices + offset + 32 <= indices + length
        count += append_set_bits(bits, word_first, indices + count);
      } else {
        for (; bits != 0; bits &= bits - 1)
          indices[count++] = word_first + static_cast<std::uint32_t>(std::countr_zero(bits));
      }
    }
    visit(first, indices, count);
  }
}

/// Key values from `lower` to `upper`, both included.
struct key_bracket {
  std::uint32_t lower = 0, upper = 0;

  /// The bits below which keys of the bracket may differ.
  int free_bits() const { return lower == upper ? 0 : 32 - std::countl_zero(lower ^ upper); }
};

/// The keys of one radix bin.
inline key_bracket bin_bracket(std::uint32_t bin) {
  const std::uint32_t lower = bin << select_radix_shift;
  return {lower, lower | ((1u << select_radix_shift) - 1)};
}

/// Bit j says whether key j of the `length` keys from `keys` (32 but at the end) is in `bracket`.
DROPIT_ALWAYS_INLINE std::uint32_t bits_within(const std::uint32_t* keys, int length,
                                               key_bracket bracket) {
  const std::uint32_t span = bracket.upper - bracket.lower;
  if (length == 32) return word_mask(keys, bracket.lower, span);
  std::uint32_t bits = 0;
  for (int j = 0; j < length; ++j)
    bits |= static_cast<std::uint32_t>(keys[j] - bracket.lower <= span) << j;
  return bits;
}

/// Bit j says whether key j of the `length` keys from `keys` is above `cut`.
DROPIT_ALWAYS_INLINE std::uint32_t bits_above(const std::uint32_t* keys, int length,
                                              std::uint32_t cut) {
  return cut == 0xffffffffu ? 0u : bits_within(keys, length, {cut + 1, 0xffffffffu});
}

struct bracket_count {
  std::int64_t above = 0;   // keys above the bracket
  std::int64_t inside = 0;  // keys in it, gathered
};

/// Appends the keys of `keys[0, n)` inside `bracket` to `out`, in index order, and counts those
/// above it unless `count_above` is false: one pass, branch-free.
inline bracket_count collect_bracket(const std::uint32_t* keys, std::int64_t n,
                                     key_bracket bracket, std::uint32_t* out,
                                     bool count_above = true) {
  bracket_count count;
  for_each_compacted_block(
      n,
      [&](std::int64_t word, int length) {
        const std::uint32_t* word_keys = keys + word * 32;
        if (count_above) count.above += std::popcount(bits_above(word_keys, length, bracket.upper));
        return bits_within(word_keys, length, bracket);
      },
      [&](std::int64_t first, const std::uint32_t* indices, std::int64_t inside) {
        for (std::int64_t j = 0; j < inside; ++j) out[count.inside + j] = keys[first + indices[j]];
        count.inside += inside;
      });
  return count;
}

/// Appends to `out` the keys of `keys[0, n)` in radix bin `bin`, in index order; returns how many.
inline std::int64_t collect_bin(const std::uint32_t* keys, std::int64_t n, std::uint32_t bin,
                                std::uint32_t* out) {
  return collect_bracket(keys, n, bin_bracket(bin), out, false).inside;
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

/// Inputs from this many keys bracket the cut from a sample of every `bracket_sample_stride`-th
/// key instead of counting them all: counting is the one step that does not vectorise.
inline constexpr std::int64_t sampled_bracket_keys = 4096;
inline constexpr std::int64_t bracket_sample_stride = 16;

/// Radix bins that hold the k-th largest of `keys[0, n)` unless the sample misleads: those the
/// k-th largest sample falls in, widened by three standard deviations of its rank (plus two).
inline key_bracket sampled_bracket(const std::uint32_t* keys, std::int64_t n, std::int64_t k) {
  const radix_histogram sample(keys, n, bracket_sample_stride);
  const double samples = static_cast<double>((n + bracket_sample_stride - 1) / bracket_sample_stride);
  const double rank = static_cast<double>(k) * samples / static_cast<double>(n);
  const double margin = 3.0 * std::sqrt(rank * (1.0 - rank / samples)) + 2.0;
  std::size_t bin = sample.top;
  double above = 0;
  while (bin > 0 && above + static_cast<double>(sample[bin]) <= rank - margin)
    above += static_cast<double>(sample[bin--]);
  // With too few samples above the cut, anything up to the largest key may be needed.
  const std::size_t upper_bin = rank - margin < 0 ? radix_histogram::bins - 1 : bin;
  while (bin > 0 && above + static_cast<double>(sample[bin]) < rank + margin)
    above += static_cast<double>(sample[bin--]);
  return {bin_bracket(static_cast<std::uint32_t>(bin)).lower,
          bin_bracket(static_cast<std::uint32_t>(upper_bin)).upper};
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
  if (n >= sampled_bracket_keys) {
    const key_bracket bracket = sampled_bracket(keys, n, k);
    const bracket_count count = collect_bracket(keys, n, bracket, scratch);
    if (count.above < k && count.above + count.inside >= k)
      return narrow_candidates(scratch, count.inside, k - count.above, bracket.free_bits());
    // The sample misled (rare, and only costs time): count every key.
  }
  const radix_histogram histogram(keys, n);
  const bin_choice choice = choose_bin(histogram, k);
  // Only the bin's keys remain candidates (a few percent for real activations).
  const std::int64_t candidates = collect_bin(keys, n, choice.bin, scratch);
  return narrow_candidates(scratch, candidates, k - choice.above);
}

/// Calls `on_word(word, bits)` for each 32-key word of `keys[0, n)`, where bit j of `bits` says
/// whether key 32 * word + j is kept under `cut` (keys above the cut, and the first `cut.ties`
/// keys equal to it), and `visit(first, indices, count)` for each block of `compaction_block` keys
/// from `first` with the ascending indices (from `first`) of its kept keys.
template <class OnWord, class Visit>
void for_each_selected_block(const std::uint32_t* keys, std::int64_t n, threshold cut,
                             OnWord&& on_word, Visit&& visit) {
  std::int64_t ties_left = cut.ties;
  for_each_compacted_block(
      n,
      [&](std::int64_t word, int length) {
        const std::uint32_t* word_keys = keys + word * 32;
        std::uint32_t above = bits_above(word_keys, length, cut.key);
        if (ties_left > 0) {  // lowest indices first
          std::uint32_t equal = bits_within(word_keys, length, {cut.key, cut.key});
          for (; equal != 0 && ties_left > 0; --ties_left) {
            above |= equal & (0u - equal);
            equal &= equal - 1;
          }
        }
        on_word(word, above);
        return above;
      },
      visit);
}

/// Calls `visit(index)` for each kept key, ascending.
template <class Visit>
void for_each_selected(const std::uint32_t* keys, std::int64_t n, threshold cut, Visit&& visit) {
  for_each_selected_block(
      keys, n, cut, [](std::int64_t, std::uint32_t) {},
      [&](std::int64_t first, const std::uint32_t* indices, std::int64_t count) {
        for (std::int64_t j = 0; j < count; ++j) visit(first + indices[j]);
      });
}

}  // namespace dropit::detail::cpu
