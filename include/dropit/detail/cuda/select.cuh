#pragma once
// Block-level selection: which of a run of candidates form the `k` largest keys, ties to the lower
// index, exactly as the CPU backend decides it (the keys are the shared ones of common/keys.hpp, so
// the kept sets agree bit for bit).
//
// A selection is a cut (common/keys.hpp's `threshold`): keep every key above `key` and the first
// `ties` keys equal to it. `block_select` finds the cut of one chunk inside one block by MSB radix
// passes (11 bits each) over a shared-memory histogram; `emit_selected` then gives each warp a
// segment of the candidates in index order, and two warp votes per 32 candidates give every kept
// candidate its output slot, so writers store values and positions in ascending position order
// with no further coordination.

#include <cub/block/block_scan.cuh>

#include <cstdint>
#include <type_traits>

#include "../../policy.hpp"
#include "../common/keys.hpp"
#include "common.cuh"

namespace dropit::detail::cuda {

template <class Key>
struct cut {
  Key key = 0;
  std::uint64_t ties = 0;
};

// ---------------------------------------------------------------------------------------------
// Keys.

/// The keys of a selection's candidates (selection_traits::key): ranked values of `data`, or
/// generator draws of `stream` (`data` unused, may be null).
template <class Selection, class T>
struct selection_keys {
  const T* data;
  std::uint64_t seed, stream;
  __device__ std::uint32_t operator()(std::uint64_t i) const {
    using traits = selection_traits<Selection>;
    if constexpr (traits::ranks_values)
      return traits::key(data[i], seed, stream, i);
    else
      return traits::key(T{}, seed, stream, i);
  }
};

/// Keys computed beforehand (channel scores).
template <class Key>
struct stored_keys {
  const Key* keys;
  __device__ Key operator()(std::uint64_t i) const { return keys[i]; }
};

/// The keys of a chunk staged in shared memory (see select_chunks_kernel): computed from its
/// values for selections that rank values, else the generator draws themselves.
template <class Selection, class Staged>
struct staged_keys {
  const Staged* items;
  __device__ std::uint32_t operator()(std::uint64_t i) const {
    using traits = selection_traits<Selection>;
    if constexpr (traits::ranks_values)
      return traits::key(items[i], 0, 0, i);
    else
      return items[i];
  }
};

// ---------------------------------------------------------------------------------------------
// Selection inside one block (32-bit keys, at most 2^32 - 1 candidates).

/// Adds to `histogram[bin]` one for every lane of the warp holding `bin` (lanes holding
/// `radix_bins` count nowhere), with one shared-memory atomic per distinct bin: magnitudes of one
/// tensor share a few exponents, so the lanes of a warp mostly fall into two or three bins, which
/// one atomic per lane would serialise. Called by all 32 lanes of the warp together. (The
/// whole-tensor selection's 8-bit passes; a chunk's 11-bit passes use count_digit.)
__device__ inline void count_in_warp(std::uint32_t* histogram, std::uint32_t bin) {
  const std::uint32_t peers = __match_any_sync(0xffffffffu, bin);
  if (bin < radix_bins && (threadIdx.x & 31u) == static_cast<std::uint32_t>(__ffs(peers) - 1))
    atomicAdd(&histogram[bin], static_cast<std::uint32_t>(__popc(peers)));
}

/// A chunk's cut is found by three MSB radix passes of 11, 11 and 10 bits (two for keys whose low
/// 16 bits are zero: the 16-bit types), over a 2048-bin shared histogram.
inline constexpr int chunk_digit_bits = 11;
inline constexpr std::uint32_t chunk_bins = 1u << chunk_digit_bits;
inline constexpr int chunk_bins_per_thread = chunk_bins / block_threads;
static_assert(chunk_bins % block_threads == 0);

/// Adds one to `histogram[digit]` for every lane holding a digit (`chunk_bins`: none). Lanes of a
/// warp mostly hold different digits (the first pass splits each exponent four ways, the later
/// ones count only the few keys still matching the prefix), so each adds its own;
/// digit 0 — zeros, which ReLU outputs and padding are full of — is counted with one vote and one
/// atomic per warp, since a warp of zeros would otherwise serialise 32 atomics on one address.
/// Called by all 32 lanes of the warp together.
__device__ inline void count_digit(std::uint32_t* histogram, std::uint32_t digit) {
  const std::uint32_t zeros = __ballot_sync(0xffffffffu, digit == 0);
  if (digit != 0 && digit < chunk_bins) atomicAdd(&histogram[digit], 1u);
  if ((threadIdx.x & 31u) == 0 && zeros != 0) atomicAdd(&histogram[0], __popc(zeros));
}

/// Keys each lane loads at once in a counting pass: from shared memory, or (fewer, each holding
/// a 64-bit address) from global memory.
inline constexpr int staged_count_batch = 8;
inline constexpr int global_count_batch = 4;

struct block_select_storage {
  std::uint32_t histogram[chunk_bins];
  typename cub::BlockScan<std::uint32_t, block_threads>::TempStorage scan;
  std::uint32_t digit;
  std::uint32_t needed;
};

/// The cut keeping `k` of the `length` keys `key_of(0 .. length-1)`, whose low `32 - KeyBits` bits
/// are zero. Called by every thread of the block; reads the keys once per radix pass (three, or
/// two when KeyBits <= 22) unless everything is kept, `CountBatch` at a time per lane.
template <int KeyBits, int CountBatch, class KeyOf>
__device__ cut<std::uint32_t> block_select(const KeyOf& key_of, std::uint32_t length,
                                           std::uint32_t k, block_select_storage& s) {
  if (k >= length) return {0u, length};                  // every key is >= 0: keep all
  std::uint32_t prefix = 0, mask = 0, needed = k;        // needed in [1, keys matching prefix]
  constexpr int last_shift = 32 - 2 * chunk_digit_bits;  // of the second pass; the third is at 0
  constexpr int passes = 32 - KeyBits >= last_shift ? 2 : 3;
  const unsigned lane = threadIdx.x & 31u;
  for (int pass = 0; pass < passes; ++pass) {
    const int shift = pass == 2 ? 0 : 32 - (pass + 1) * chunk_digit_bits;
    const std::uint32_t digit_mask = pass == 2 ? (1u << last_shift) - 1u : chunk_bins - 1u;
    for (std::uint32_t b = threadIdx.x; b < chunk_bins; b += block_threads) s.histogram[b] = 0;
    __syncthreads();
    // Warp by warp, so that all 32 lanes take part in every vote; each lane loads a batch of keys
    // before it counts any (the loads overlap instead of each waiting behind an atomic).
    for (std::uint32_t base = threadIdx.x & ~31u; base < length;
         base += CountBatch * block_threads) {
      std::uint32_t digits[CountBatch];
#pragma unroll
      for (int j = 0; j < CountBatch; ++j) {
        const std::uint32_t i = base + j * block_threads + lane;
        const std::uint32_t key = i < length ? key_of(i) : 0u;
        digits[j] = i < length && (key & mask) == prefix ? (key >> shift) & digit_mask
                                                         : chunk_bins;  // none
      }
#pragma unroll
      for (int j = 0; j < CountBatch; ++j) count_digit(s.histogram, digits[j]);
    }
    __syncthreads();
    // Thread t holds the bins from chunk_bins - 1 - 8t down, so the inclusive sum of its group's
    // counts is the number of keys in its lowest bin or above.
    const std::uint32_t top = chunk_bins - 1 - threadIdx.x * chunk_bins_per_thread;
    std::uint32_t counts[chunk_bins_per_thread];
    std::uint32_t group = 0;
#pragma unroll
    for (int j = 0; j < chunk_bins_per_thread; ++j) group += counts[j] = s.histogram[top - j];
    std::uint32_t at_or_above = 0;
    cub::BlockScan<std::uint32_t, block_threads>(s.scan).InclusiveSum(group, at_or_above);
    std::uint32_t above = at_or_above - group;
    if (above < needed && needed <= at_or_above) {  // exactly one thread
#pragma unroll
      for (int j = 0; j < chunk_bins_per_thread; ++j) {
        if (above < needed && needed <= above + counts[j]) {
          s.digit = top - j;
          s.needed = needed - above;
        }
        above += counts[j];
      }
    }
    __syncthreads();
    prefix |= s.digit << shift;
    mask |= digit_mask << shift;
    needed = s.needed;
    // The next write of digit/needed, of the scan storage or of the histogram comes after at
    // least one more barrier.
  }
  return {prefix, needed};
}

// ---------------------------------------------------------------------------------------------
// Emitting a cut.

inline constexpr int block_warps = block_threads / 32;

struct emit_storage {
  std::uint32_t above[block_warps];  // keys above the cut in each warp's segment
  std::uint32_t equal[block_warps];  // keys equal to it
};

/// Words (of 32 candidates) whose keys a warp loads at once when it emits.
inline constexpr int emit_batch = 4;

__device__ inline std::uint32_t warp_sum(std::uint32_t value) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2)
    value += __shfl_xor_sync(0xffffffffu, value, offset);
  return value;
}

/// Calls `visit(i, in_range, keep, slot)` for the candidates [begin, end) in index order within
/// each warp. `slot` counts the kept candidates before `i` since the start of the selection;
/// `above_before` / `equal_before` count the keys above / equal to the cut before `begin`.
/// Every warp takes one segment of whole 32-candidate words, in order: it counts its keys above
/// and equal to the cut, the block adds up the counts of the warps before it, and then it walks its
/// segment a word at a time, where two votes and their popcounts give every kept candidate its
/// slot — no block-wide scan per word. A visitor is called by all 32 lanes together (it may vote);
/// lane 0 holds the word's first candidate when `begin` is a multiple of 32. Reads every key
/// twice; called by every thread of the block; at most 2^32 - 1 candidates.
template <class Key, class KeyOf, class Visit>
__device__ void emit_selected(const KeyOf& key_of, cut<Key> c, std::uint64_t begin,
                              std::uint64_t end, std::uint64_t above_before,
                              std::uint64_t equal_before, emit_storage& s, const Visit& visit) {
  const unsigned lane = threadIdx.x & 31u, warp = threadIdx.x / 32;
  const std::uint64_t length = end - begin;
  const std::uint64_t segment = (length + 32 * block_warps - 1) / (32 * block_warps) * 32;
  const std::uint64_t first = begin + (warp * segment < length ? warp * segment : length);
  const std::uint64_t last =
      begin + ((warp + 1) * segment < length ? (warp + 1) * segment : length);

  std::uint32_t above = 0, equal = 0;
  for (std::uint64_t i = first + lane; i < last; i += 32) {
    const Key key = key_of(i);
    above += key > c.key;
    equal += key == c.key;
  }
  above = warp_sum(above);
  equal = warp_sum(equal);
  if (lane == 0) {
    s.above[warp] = above;
    s.equal[warp] = equal;
  }
  __syncthreads();
  for (unsigned w = 0; w < warp; ++w) {
    above_before += s.above[w];
    equal_before += s.equal[w];
  }
  const std::uint32_t lanes_below = (1u << lane) - 1u;
  // A batch of words at a time, every key of the batch loaded before the first is written out.
  for (std::uint64_t batch = first; batch < last; batch += 32 * emit_batch) {
    Key keys[emit_batch];
#pragma unroll
    for (int j = 0; j < emit_batch; ++j) {
      const std::uint64_t i = batch + 32 * j + lane;
      keys[j] = i < last ? key_of(i) : Key{0};
    }
#pragma unroll
    for (int j = 0; j < emit_batch; ++j) {
      const std::uint64_t word = batch + 32 * j;
      if (word >= last) break;  // uniform across the warp
      const std::uint64_t i = word + lane;
      const bool in_range = i < last;
      const std::uint32_t above_lanes = __ballot_sync(0xffffffffu, in_range && keys[j] > c.key);
      const std::uint32_t equal_lanes = __ballot_sync(0xffffffffu, in_range && keys[j] == c.key);
      const std::uint64_t equal_rank = equal_before + __popc(equal_lanes & lanes_below);
      const bool keep =
          ((above_lanes >> lane) & 1u) || (((equal_lanes >> lane) & 1u) && equal_rank < c.ties);
      // The ties kept before i are the first ones: min(equal keys before i, ties).
      const std::uint64_t slot = above_before + __popc(above_lanes & lanes_below) +
                                 (equal_rank < c.ties ? equal_rank : c.ties);
      visit(i, in_range, keep, slot);
      above_before += __popc(above_lanes);
      equal_before += __popc(equal_lanes);
    }
  }
  __syncthreads();  // before the counts are written again
}

// ---------------------------------------------------------------------------------------------
// Visitors of emit_selected. Each describes one chunk (pointers already at the chunk's start);
// `at(layout, chunk)` moves a whole-cache visitor to a chunk.

/// Values only (seeded caches).
template <class T>
struct value_writer {
  const T* data;
  T* values;
  __device__ value_writer at(const cache_layout& layout, std::int64_t chunk) const {
    return {data + layout.chunk_begin(chunk), values + layout.values_begin(chunk)};
  }
  __device__ void operator()(std::uint64_t i, bool, bool keep, std::uint64_t slot) const {
    if (keep) values[slot] = data[i];
  }
};

/// Values and one LSB-first mask word per 32 candidates.
template <class T>
struct bitmask_writer {
  const T* data;
  T* values;
  std::uint32_t* words;
  __device__ bitmask_writer at(const cache_layout& layout, std::int64_t chunk) const {
    return {data + layout.chunk_begin(chunk), values + layout.values_begin(chunk),
            words + layout.mask_word_begin(chunk)};
  }
  __device__ void operator()(std::uint64_t i, bool in_range, bool keep, std::uint64_t slot) const {
    if (keep) values[slot] = data[i];
    const std::uint32_t bits = __ballot_sync(0xffffffffu, keep);
    // Lane 0 holds the word's first candidate: the word exists if that candidate does.
    if ((threadIdx.x & 31u) == 0 && in_range) words[i / 32] = bits;
  }
};

/// Values and their offsets within the chunk (16 or 32 bits).
template <class T, class Offset>
struct offset_writer {
  const T* data;
  T* values;
  Offset* offsets;
  __device__ offset_writer at(const cache_layout& layout, std::int64_t chunk) const {
    return {data + layout.chunk_begin(chunk), values + layout.values_begin(chunk),
            offsets + layout.values_begin(chunk)};
  }
  __device__ void operator()(std::uint64_t i, bool, bool keep, std::uint64_t slot) const {
    if (keep) {
      values[slot] = data[i];
      offsets[slot] = static_cast<Offset>(i);
    }
  }
};

/// The dense chunk a seeded cache stands for: kept values (scaled when the cache rescales) where
/// the regenerated draw keeps, zeros elsewhere. Writes every element of the chunk.
template <class T, class Out>
struct dense_writer {
  const T* values;
  Out* out;
  bool rescale;
  float scale;
  __device__ dense_writer at(const cache_layout& layout, std::int64_t chunk) const {
    return {values + layout.values_begin(chunk), out + layout.chunk_begin(chunk), layout.rescale,
            layout.value_scale(chunk)};
  }
  __device__ void operator()(std::uint64_t i, bool in_range, bool keep, std::uint64_t slot) const {
    if (in_range) out[i] = keep ? densified<Out>(values[slot], rescale, scale) : Out{};
  }
};

/// The ascending list of kept candidates (channels).
struct index_writer {
  std::uint32_t* list;
  __device__ void operator()(std::uint64_t i, bool, bool keep, std::uint64_t slot) const {
    if (keep) list[slot] = static_cast<std::uint32_t>(i);
  }
};

}  // namespace dropit::detail::cuda
