#pragma once
// Block-level selection: which of a run of candidates form the `k` largest keys, ties to the lower
// index, exactly as the CPU backend decides it (the keys are the shared ones of common/keys.hpp, so
// the kept sets agree bit for bit).
//
// A selection is a cut (common/keys.hpp's `threshold`): keep every key above `key` and the first
// `ties` keys equal to it. `block_select` finds the cut of one chunk inside one block by MSB radix
// passes (8 bits each) over a shared-memory histogram, counted with warp-aggregated atomics;
// `emit_selected` then walks the candidates in index order, one tile of `block_threads` at a time,
// and a block scan of the (above, equal) flags gives every kept candidate its output slot, so
// writers store values and positions in ascending position order with no further coordination.

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

// ---------------------------------------------------------------------------------------------
// Selection inside one block (32-bit keys, at most 2^32 - 1 candidates).

/// Adds to `histogram[bin]` one for every lane of the warp holding `bin` (lanes holding
/// `radix_bins` count nowhere), with one shared-memory atomic per distinct bin: magnitudes of one
/// tensor share a few exponents, so the lanes of a warp mostly fall into two or three bins, which
/// one atomic per lane would serialise. Called by all 32 lanes of the warp together.
__device__ inline void count_in_warp(std::uint32_t* histogram, std::uint32_t bin) {
  const std::uint32_t peers = __match_any_sync(0xffffffffu, bin);
  if (bin < radix_bins && (threadIdx.x & 31u) == static_cast<std::uint32_t>(__ffs(peers) - 1))
    atomicAdd(&histogram[bin], static_cast<std::uint32_t>(__popc(peers)));
}

struct block_select_storage {
  std::uint32_t histogram[radix_bins];
  typename cub::BlockScan<std::uint32_t, block_threads>::TempStorage scan;
  std::uint32_t digit;
  std::uint32_t needed;
};

/// The cut keeping `k` of the `length` keys `key_of(0 .. length-1)`. Called by every thread of the
/// block; reads the keys four times (once per radix digit) unless everything is kept.
template <class KeyOf>
__device__ cut<std::uint32_t> block_select(const KeyOf& key_of, std::uint32_t length,
                                           std::uint32_t k, block_select_storage& s) {
  if (k >= length) return {0u, length};            // every key is >= 0: keep all
  std::uint32_t prefix = 0, mask = 0, needed = k;  // needed in [1, keys matching prefix]
  for (int shift = 24; shift >= 0; shift -= 8) {
    s.histogram[threadIdx.x] = 0;
    __syncthreads();
    for (std::uint32_t base = threadIdx.x & ~31u; base < length; base += block_threads) {
      const std::uint32_t i = base + (threadIdx.x & 31u);
      std::uint32_t bin = radix_bins;  // none: out of range, or outside the prefix
      if (i < length) {
        const std::uint32_t key = key_of(i);
        if ((key & mask) == prefix) bin = (key >> shift) & 0xffu;
      }
      count_in_warp(s.histogram, bin);
    }
    __syncthreads();
    // Thread t holds bin 255 - t, so its inclusive sum counts the keys in its bin or above.
    const std::uint32_t bin = radix_bins - 1 - threadIdx.x;
    const std::uint32_t count = s.histogram[bin];
    std::uint32_t at_or_above = 0;
    cub::BlockScan<std::uint32_t, block_threads>(s.scan).InclusiveSum(count, at_or_above);
    const std::uint32_t above = at_or_above - count;
    if (above < needed && needed <= at_or_above) {  // exactly one thread
      s.digit = bin;
      s.needed = needed - above;
    }
    __syncthreads();
    prefix |= s.digit << shift;
    mask |= 0xffu << shift;
    needed = s.needed;
    // The next write of digit/needed or of the scan storage comes after two more barriers.
  }
  return {prefix, needed};
}

// ---------------------------------------------------------------------------------------------
// Emitting a cut.

struct emit_storage {
  typename cub::BlockScan<std::uint64_t, block_threads>::TempStorage scan;
};

/// Walks candidates [begin, end) in tiles of `block_threads`, in index order, and calls
/// `visit(i, in_range, keep, slot)` on every thread of the block for each tile (so a visitor may
/// use warp votes). `slot` counts the kept candidates before `i` since the start of the selection;
/// `above_before` / `equal_before` count the keys above / equal to the cut before `begin`. `begin`
/// must be a multiple of 32 for visitors that vote per 32-candidate word.
template <class Key, class KeyOf, class Visit>
__device__ void emit_selected(const KeyOf& key_of, cut<Key> c, std::uint64_t begin,
                              std::uint64_t end, std::uint64_t above_before,
                              std::uint64_t equal_before, emit_storage& s, const Visit& visit) {
  using scan_t = cub::BlockScan<std::uint64_t, block_threads>;
  for (std::uint64_t tile = begin; tile < end; tile += block_threads) {
    const std::uint64_t i = tile + threadIdx.x;
    const bool in_range = i < end;
    const Key key = in_range ? key_of(i) : Key{0};
    const bool above = in_range && key > c.key;
    const bool equal = in_range && key == c.key;
    // Both counts in one scan: a tile holds fewer than 2^32 of either.
    std::uint64_t before = 0, tile_total = 0;
    scan_t(s.scan).ExclusiveSum((std::uint64_t{above} << 32) | std::uint64_t{equal}, before,
                                tile_total);
    const std::uint64_t equal_rank = equal_before + (before & 0xffffffffu);
    const bool keep = above || (equal && equal_rank < c.ties);
    // The ties kept before i are the first ones: min(equal keys before i, ties).
    const std::uint64_t slot =
        above_before + (before >> 32) + (equal_rank < c.ties ? equal_rank : c.ties);
    visit(i, in_range, keep, slot);
    above_before += tile_total >> 32;
    equal_before += tile_total & 0xffffffffu;
    __syncthreads();  // before the scan storage is reused
  }
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
