#pragma once
// Block-level selection: which of a run of candidates form the `k` largest keys, ties to the lower
// index, exactly as the CPU backend decides it (the keys are the shared ones of common/keys.hpp, so
// the kept sets agree bit for bit).
//
// A selection is a cut (common/keys.hpp's `threshold`): keep every key above `key` and the first
// `ties` keys equal to it. `block_select` finds the cut of one chunk inside one block by MSB radix
// passes over shared-memory histograms: 11 bits over every key, then the rest over the few keys
// of the bin that holds the cut, collected by each warp from its own segment of the chunk, whose
// keys in higher bins it counts on the way (the collected ones at the cut are added once it is
// known), and searched by one warp. `emit_counted` then walks each warp's segment in
// index order, 128 candidates at a time in four rounds of 32 consecutive ones: a round's keep bits
// are one warp ballot, which is its bitmask word and, with popcounts, every kept candidate's output
// slot, so writers store values and positions in ascending position order with no further
// coordination (`emit_selected` counts the segments first, for ranges without block_select).

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
  /// Every key equal to `key` is kept (the usual case: one key holds it): the kept keys are those
  /// at or above it, and the emit ranks no tie.
  bool all_ties = false;
};

/// The cut keeping `k` of `m` keys where no search is needed (k == 0 or k >= m): none (nothing is
/// above the largest key, no tie kept) or all (every key is >= 0, every tie kept).
template <class Key>
__host__ __device__ cut<Key> cut_without_search(std::uint64_t m, std::uint64_t k) {
  return k == 0 ? cut<Key>{static_cast<Key>(~Key{0}), 0, false} : cut<Key>{Key{0}, m, true};
}

// ---------------------------------------------------------------------------------------------
// Keys.

/// `N` consecutive items of an array, loaded or stored at once (from an index that is a multiple
/// of N, the array aligned to N items).
template <class Item, int N>
struct alignas(N * sizeof(Item)) consecutive_items {
  Item item[N];
};
template <class Item>
using four_items = consecutive_items<Item, 4>;
/// As many items as 16 bytes hold: one vector load or store (four float, eight 16-bit).
template <class Item>
using sixteen_bytes_of = consecutive_items<Item, 16 / sizeof(Item)>;

/// Selections that rank values rank them by magnitude (their traits' key is magnitude_key, as the
/// CUDA backend assumes throughout); `Clamped` false gives those keys before the clamp of NaN
/// payloads (magnitude_order), which compare with a cut as the keys do (unclamped_keys).
template <class Selection, class T, bool Clamped>
__device__ inline std::uint32_t value_key(T value) {
  if constexpr (Clamped)
    return selection_traits<Selection>::key(value, 0, 0, 0);
  else
    return magnitude_order(value);
}

/// The largest key of a selection that ranks values of type T (a NaN's), or of generator draws.
template <class Selection, class T>
inline constexpr std::uint32_t largest_key_of = [] {
  if constexpr (selection_traits<Selection>::ranks_values)
    return magnitude_key_max<T>;
  else
    return ~std::uint32_t{0};
}();

/// The keys of a selection's candidates (selection_traits::key): ranked values of `data`, or
/// generator draws of `stream` (`data` unused, may be null).
template <class Selection, class T, bool Clamped = true>
struct selection_keys {
  const T* data;
  std::uint64_t seed, stream;
  __device__ std::uint32_t operator()(std::uint64_t i) const {
    using traits = selection_traits<Selection>;
    if constexpr (traits::ranks_values)
      return value_key<Selection, T, Clamped>(data[i]);
    else
      return traits::key(T{}, seed, stream, i);
  }
  /// The same keys unclamped (magnitudes; see unclamped_keys).
  static constexpr std::uint32_t largest_key = largest_key_of<Selection, T>;
  __device__ selection_keys<Selection, T, false> unclamped() const
      requires(selection_traits<Selection>::ranks_values) {
    return {data, seed, stream};
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
template <class Selection, class Staged, bool Clamped = true>
struct staged_keys {
  const Staged* items;
  __device__ static std::uint32_t key_of_item(Staged item) {
    if constexpr (selection_traits<Selection>::ranks_values)
      return value_key<Selection, Staged, Clamped>(item);
    else
      return item;
  }
  __device__ std::uint32_t operator()(std::uint32_t i) const { return key_of_item(items[i]); }
  /// Keys i .. i+3 from one vector load (`i` a multiple of 4; the items are 16-byte aligned).
  __device__ void four(std::uint32_t i, std::uint32_t (&keys)[4]) const {
    const auto loaded = *reinterpret_cast<const four_items<Staged>*>(items + i);
#pragma unroll
    for (int j = 0; j < 4; ++j) keys[j] = key_of_item(loaded.item[j]);
  }
  /// The same keys unclamped (magnitudes; see unclamped_keys).
  static constexpr std::uint32_t largest_key = largest_key_of<Selection, Staged>;
  __device__ staged_keys<Selection, Staged, false> unclamped() const
      requires(selection_traits<Selection>::ranks_values) {
    return {items};
  }
};

/// Key sources of magnitudes that also give their keys before the clamp of NaN payloads:
/// `key_of.unclamped()(i) >= t` exactly where `key_of(i) >= t`, for every t up to
/// KeyOf::largest_key; a key at or above largest_key unclamped is largest_key clamped; and no key,
/// clamped or not, exceeds magnitude_order_max (the sign bit is clear).
template <class KeyOf>
concept has_unclamped_keys = requires(const KeyOf& key_of) {
  key_of.unclamped();
  KeyOf::largest_key;
};

/// Keys that compare with a cut at or above it as `key_of`'s do, one instruction cheaper for
/// magnitudes (no clamp of NaN payloads; a cut is at most the largest key): `key_of.unclamped()`,
/// or the keys themselves.
template <class KeyOf>
__device__ auto unclamped_keys(const KeyOf& key_of) {
  if constexpr (has_unclamped_keys<KeyOf>)
    return key_of.unclamped();
  else
    return key_of;
}

// ---------------------------------------------------------------------------------------------
// Selection inside one block (32-bit keys, under 2^32 - 2048 candidates: the passes step 32-bit
// indices by up to 2048; chunks hold at most 2^16).

/// Key sources in shared memory offer `four`: the keys i .. i+3 from one vector load, for `i` a
/// multiple of 4.
template <class KeyOf>
concept loads_four_keys = requires(const KeyOf& key_of, std::uint32_t (&keys)[4]) {
  key_of.four(std::uint32_t{0}, keys);
};

/// Key sources whose `four` may also read the keys of a last batch of four that the end cuts
/// short (the items past the end are memory of theirs, whatever it holds).
template <class KeyOf>
concept readable_to_four = loads_four_keys<KeyOf> && KeyOf::whole_fours_readable;

/// Four keys `key_of(i .. i+3)`, those at `end` or beyond read as 0 (callers test the index).
template <class Key, class KeyOf>
__device__ inline void load_four_keys(const KeyOf& key_of, std::uint64_t i, std::uint64_t end,
                                      Key (&keys)[4]) {
  if constexpr (loads_four_keys<KeyOf>) {
    if (i + 4 <= end) {  // shared memory: a 32-bit index
      key_of.four(static_cast<std::uint32_t>(i), keys);
      return;
    }
  }
#pragma unroll
  for (int j = 0; j < 4; ++j) keys[j] = i + j < end ? key_of(i + j) : Key{0};
}

/// A chunk's cut is found by MSB radix passes. The first takes the top 11 bits of every key into a
/// 2048-bin histogram. The keys of the bin holding the cut — a few percent of a chunk of
/// magnitudes (a quarter of an octave), 1/2048 of one of random draws — are then copied into the
/// histogram's memory, and the remaining 21 bits (5 for 16-bit types, whose low 16 bits are zero)
/// are decided over those candidates alone, 8 bits at a time over a 256-bin histogram, by one warp
/// (a few hundred keys: the other warps wait, issuing nothing). When the bin holds more keys than
/// fit (ties, zeros, values in a narrow range), the later passes scan every key instead, 11 bits
/// at a time, by the whole block.
inline constexpr int chunk_digit_bits = 11;
inline constexpr std::uint32_t chunk_bins = 1u << chunk_digit_bits;
inline constexpr int candidate_digit_bits = 8;
inline constexpr std::uint32_t candidate_bins = 1u << candidate_digit_bits;

/// A cut being searched: the digits decided so far (`prefix` under `mask`), how many keys match
/// them, and how many of those are still to keep (in [1, matching]). Fewer than 2^32 candidates.
template <class Key>
struct cut_search {
  Key prefix = 0, mask = 0;
  std::uint32_t matching = 0, needed = 0;
};

/// What pick_digit shares across the block (or the warp).
struct digit_pick_storage {
  typename cub::BlockScan<std::uint32_t, block_threads>::TempStorage scan;
  std::uint32_t digit, needed, matching;
};

/// The threads of a radix pass's team — the whole block, or one warp (`Threads` == 32) — wait for
/// one another, their shared-memory writes seen by all of them.
template <int Threads>
__device__ inline void team_sync() {
  static_assert(Threads == block_threads || Threads == 32, "a team is the block or one warp");
  if constexpr (Threads == block_threads)
    __syncthreads();
  else
    __syncwarp();
}

/// Bins past a histogram's own, one per lane: a radix pass adds every key it does not count
/// there, so that its atomics take no branch. Never read.
inline constexpr std::uint32_t discard_bins = 32;

struct block_select_storage {
  union alignas(16) {
    std::uint32_t histogram[chunk_bins + discard_bins];  // passes over every key
    std::uint32_t candidates[chunk_bins];  // the first pass's boundary bin (candidate_keys)
  };
  std::uint32_t candidate_histogram[candidate_bins + discard_bins];  // passes over the candidates
  digit_pick_storage pick;
  std::uint32_t candidate_count;
  cut_search<std::uint32_t> candidates_search;  // as warp 0 leaves it, for the block
};

/// The cut a search found once every bit is decided: its prefix is the cut's key, and `matching`
/// counts the keys equal to it.
template <class Key>
__host__ __device__ cut<Key> found_cut(const cut_search<Key>& search) {
  return {search.prefix, search.needed, search.needed == search.matching};
}

/// Narrows `search` to the bin of the next digit — `Bins` bins, at `shift` under `digit_mask` —
/// that holds the cut, from `count_of(bin)`: the matching keys in each bin but bin 0, which radix
/// passes leave uncounted (a warp of zeros, which ReLU outputs and padding are full of, would
/// serialise 32 atomics on one address) — its count is what the other bins leave of `matching`.
/// Called by every thread of the team (`Threads`: the block, or warp 0 alone); ends with its
/// team_sync.
template <int Bins, int Threads = block_threads, class Key, class CountOf>
__device__ void pick_digit(const CountOf& count_of, int shift, std::uint32_t digit_mask,
                           cut_search<Key>& search, digit_pick_storage& s) {
  static_assert(Bins % Threads == 0, "every thread scans the same number of bins");
  // Thread t holds the bins from Bins - 1 - t * per_thread down, so the inclusive sum of its
  // group's counts is the number of matching keys in its lowest bin or above.
  constexpr int per_thread = Bins / Threads;
  const unsigned rank = threadIdx.x % Threads;
  const std::uint32_t top = Bins - 1 - rank * per_thread;
  std::uint32_t counts[per_thread];
  std::uint32_t group = 0;
#pragma unroll
  for (int j = 0; j < per_thread; ++j) group += counts[j] = count_of(top - j);
  std::uint32_t at_or_above = 0;
  if constexpr (Threads == block_threads)
    cub::BlockScan<std::uint32_t, block_threads>(s.scan).InclusiveSum(group, at_or_above);
  else
    at_or_above = warp_inclusive_sum(group);
  const std::uint32_t needed = search.needed;
  if (std::uint32_t above = at_or_above - group; above < needed && needed <= at_or_above) {
    // At most one thread: the cut is in its last bin whose keys above it are fewer than needed.
    // (Selects, then one store of each: no store per bin.)
    std::uint32_t digit = top, needed_in_bin = needed - above, matching = counts[0];
#pragma unroll
    for (int j = 1; j < per_thread; ++j) {
      above += counts[j - 1];
      if (above < needed) {
        digit = top - j;
        needed_in_bin = needed - above;
        matching = counts[j];
      }
    }
    s.digit = digit;
    s.needed = needed_in_bin;
    s.matching = matching;
  }
  // The last thread's sum covers every counted key: the cut is in bin 0 if it lies beyond.
  if (rank == Threads - 1 && needed > at_or_above) {
    s.digit = 0;
    s.needed = needed - at_or_above;
    s.matching = search.matching - at_or_above;
  }
  team_sync<Threads>();
  search.prefix |= static_cast<Key>(s.digit) << shift;
  search.mask |= static_cast<Key>(digit_mask) << shift;
  search.needed = s.needed;
  search.matching = s.matching;
  // The next write of digit/needed/matching or of the scan storage comes after at least one more
  // team_sync.
}

/// Keys each lane loads at once in a counting pass over key sources that may not be read past
/// their end: two vector loads from shared memory, or four keys from global memory (each holding
/// a 64-bit address: eight would spill on sm_80).
template <class KeyOf>
inline constexpr int count_batch = loads_four_keys<KeyOf> ? 8 : 4;

/// Calls `count(key, exists)` for every key of `key_of(0 .. length-1)` (`exists` false for the
/// few past the end that are read with the last batch), spread over the team's `Threads`.
template <int Threads, class KeyOf, class Count>
__device__ void count_keys(const KeyOf& key_of, std::uint32_t length, const Count& count) {
  const unsigned rank = threadIdx.x % Threads;
  if constexpr (readable_to_four<KeyOf>) {
    // Four keys at a time, every one checked: no separate code for the last four.
    for (std::uint32_t base = 4 * rank; base < length; base += 4 * Threads) {
      std::uint32_t keys[4];
      key_of.four(base, keys);
#pragma unroll
      for (int j = 0; j < 4; ++j) count(keys[j], base + j < length);
    }
    return;
  }
  constexpr int batch = count_batch<KeyOf>;
  constexpr std::uint32_t stride = batch * Threads;
  std::uint32_t base = batch * rank;
  // Whole batches, then the one the end cuts short (if any). Every key of a batch is loaded before
  // the first is counted: the loads overlap instead of each waiting behind an atomic.
  for (; base + batch <= length; base += stride) {
    std::uint32_t keys[batch / 4][4];
#pragma unroll
    for (int v = 0; v < batch / 4; ++v) {
      if constexpr (loads_four_keys<KeyOf>)
        key_of.four(base + 4 * v, keys[v]);
      else
#pragma unroll
        for (int j = 0; j < 4; ++j) keys[v][j] = key_of(base + 4 * v + j);
    }
#pragma unroll
    for (int v = 0; v < batch / 4; ++v)
#pragma unroll
      for (int j = 0; j < 4; ++j) count(keys[v][j], true);
  }
  if (base < length) {
    std::uint32_t keys[batch / 4][4];
#pragma unroll
    for (int v = 0; v < batch / 4; ++v) load_four_keys(key_of, base + 4 * v, length, keys[v]);
#pragma unroll
    for (int v = 0; v < batch / 4; ++v)
#pragma unroll
      for (int j = 0; j < 4; ++j) count(keys[v][j], base + 4 * v + j < length);
  }
}

/// Bins `into + 1 .. last` of a radix pass's histogram, added into bin `into` once every key is
/// counted (at most 32 bins; none by default): see block_select.
struct bin_fold {
  std::uint32_t into = 0, last = 0;
};

/// One radix pass: counts the digit `(key >> shift) & digit_mask` of every key matching the
/// search's prefix into `histogram` (`Bins` bins, 16-byte aligned, then `discard_bins`; digit 0
/// uncounted), folds the bins `Fold` names, then narrows the search to the bin holding the cut
/// (pick_digit). Called by every thread of the team (`Threads`: the block, or warp 0 alone).
template <int Bins, int Threads, bin_fold Fold = bin_fold{}, class KeyOf>
__device__ void radix_pass(const KeyOf& key_of, std::uint32_t length, int shift,
                           std::uint32_t digit_mask, cut_search<std::uint32_t>& search,
                           std::uint32_t* histogram, block_select_storage& s) {
  static_assert(Bins % (4 * Threads) == 0, "every thread clears whole vectors of four bins");
  for (std::uint32_t b = 4 * (threadIdx.x % Threads); b < Bins; b += 4 * Threads)
    *reinterpret_cast<four_items<std::uint32_t>*>(histogram + b) = {};
  team_sync<Threads>();
  // A key not counted goes to this lane's discard bin, so that the atomics take no branch.
  const std::uint32_t discard = Bins + (threadIdx.x & 31u);
  count_keys<Threads>(key_of, length, [&](std::uint32_t key, bool exists) {
    const std::uint32_t digit = (key >> shift) & digit_mask;
    const bool counted = exists && (key & search.mask) == search.prefix && digit != 0;
    atomicAdd(&histogram[counted ? digit : discard], 1u);
  });
  team_sync<Threads>();
  if constexpr (Fold.last > Fold.into) {  // by the team's first warp, a bin per lane
    static_assert(Fold.into != 0 && Fold.last < Bins && Fold.last - Fold.into <= 32);
    if (threadIdx.x % Threads < 32) {
      const std::uint32_t b = Fold.into + 1 + (threadIdx.x & 31u);
      std::uint32_t folded = 0;
      if (b <= Fold.last) {
        folded = histogram[b];
        histogram[b] = 0;
      }
      folded = warp_sum(folded);
      if ((threadIdx.x & 31u) == 0) histogram[Fold.into] += folded;
    }
    team_sync<Threads>();
  }
  pick_digit<Bins, Threads>([&](std::uint32_t bin) { return histogram[bin]; }, shift, digit_mask,
                            search, s.pick);
  // The histogram is next written after at least one more team_sync.
}

/// Radix passes of `DigitBits` bits over the bits of the keys below `low` (the higher ones
/// decided), down to the lowest bit a key of `KeyBits` bits sets, by the team `Threads`.
template <int KeyBits, int DigitBits, int Threads, class KeyOf>
__device__ void finish_search(const KeyOf& key_of, std::uint32_t length, int low,
                              cut_search<std::uint32_t>& search, std::uint32_t* histogram,
                              block_select_storage& s) {
  for (; low > 32 - KeyBits;) {
    const int shift = low > DigitBits ? low - DigitBits : 0;
    radix_pass<1 << DigitBits, Threads>(key_of, length, shift, (1u << (low - shift)) - 1u, search,
                                        histogram, s);
    low = shift;
  }
}

/// Candidates a warp takes at once when it walks a range (collect_candidates, emit_selected): four
/// rounds of 32 consecutive ones, lane l holding candidates group + l, group + 32 + l, ... — each
/// round's loads are coalesced (conflict-free in shared memory) and its votes are one ballot, which
/// the emit needs (a round's ballot is its bitmask word). Passes that only count or collect keys in
/// shared memory take four consecutive ones per lane instead: one vector load.
inline constexpr int emit_rounds = 4;
inline constexpr std::uint32_t emit_group = 32 * emit_rounds;
inline constexpr int block_warps = block_threads / 32;

__device__ inline std::uint32_t lanes_below_mask() { return (1u << (threadIdx.x & 31u)) - 1u; }

/// The calling warp's segment of the candidates [begin, end): whole 128-candidate groups, the
/// same number for every warp of the block (the last ones may be shorter or empty). Offsets within
/// a segment are 32-bit: under 2^32 - 128 candidates (chunks hold at most 2^16, spans 2^14).
struct warp_segment {
  std::uint64_t first;
  std::uint32_t count;

  __device__ warp_segment(std::uint64_t begin, std::uint64_t end) {
    const unsigned warp = threadIdx.x / 32;
    const std::uint64_t length = end - begin;
    const std::uint64_t segment =
        (length + emit_group * block_warps - 1) / (emit_group * block_warps) * emit_group;
    first = begin + (warp * segment < length ? warp * segment : length);
    const std::uint64_t last =
        begin + ((warp + 1) * segment < length ? (warp + 1) * segment : length);
    count = static_cast<std::uint32_t>(last - first);
  }
};

/// Keys above and equal to a cut in each warp's segment (count_segments, or collect_candidates
/// and count_candidates).
struct emit_storage {
  std::uint32_t above[block_warps];  // keys above the cut in each warp's segment
  std::uint32_t equal[block_warps];  // keys equal to it
};

/// The first pass's candidates as collect_candidates keeps them: the key's bits below the pass's
/// digit (which every candidate shares) and, above those, the warp whose segment holds the key.
struct candidate_keys {
  static constexpr int owner_shift = 32 - chunk_digit_bits;
  static constexpr std::uint32_t low_bits = (1u << owner_shift) - 1u;
  static_assert(block_warps <= (1 << chunk_digit_bits), "a warp index fits above the low bits");

  /// The buffer holds chunk_bins candidates: a batch of four that the collected ones end inside
  /// is read whole (the items past the end unused).
  static constexpr bool whole_fours_readable = true;

  const std::uint32_t* candidates;
  std::uint32_t prefix;  // the first pass's digit, in place

  __device__ static std::uint32_t stored(std::uint32_t key, unsigned warp) {
    return (key & low_bits) | (warp << owner_shift);
  }
  __device__ static unsigned owner(std::uint32_t candidate) { return candidate >> owner_shift; }
  __device__ std::uint32_t key(std::uint32_t candidate) const {
    return prefix | (candidate & low_bits);
  }
  __device__ std::uint32_t operator()(std::uint32_t i) const { return key(candidates[i]); }
  __device__ void four(std::uint32_t i, std::uint32_t (&out)[4]) const {
    const auto loaded = *reinterpret_cast<const four_items<std::uint32_t>*>(candidates + i);
#pragma unroll
    for (int j = 0; j < 4; ++j) out[j] = key(loaded.item[j]);
  }
};

/// After the first pass: appends the keys of the bin holding the cut (those matching the search's
/// prefix) to `s.candidates`, as candidate_keys hold them, in no particular order; and sets each
/// warp's `counts.above` to the keys of its emit segment (warp_segment over [0, length)) in higher
/// bins, `counts.equal` to 0 — count_candidates adds the candidates' share once the cut is known,
/// so that the emit needs no pass of its own to count. Called by every thread of the block; there
/// must be room for every matching key. A warp takes 128 keys at a time: four consecutive ones per
/// lane where that is one vector load (shared memory), else round j's 32 consecutive ones, one per
/// lane (coalesced global loads).
template <class KeyOf>
__device__ void collect_candidates(const KeyOf& key_of, std::uint32_t length,
                                   const cut_search<std::uint32_t>& search, block_select_storage& s,
                                   emit_storage& counts) {
  const unsigned lane = threadIdx.x & 31u, warp = threadIdx.x / 32;
  const std::uint32_t lanes_below = lanes_below_mask();
  const warp_segment seg(0, length);
  const auto first = static_cast<std::uint32_t>(seg.first);
  constexpr bool vector = loads_four_keys<KeyOf>;
  const auto index = [&](std::uint32_t group, int j) {  // within the segment
    return vector ? group + 4 * lane + j : group + 32 * j + lane;
  };
  // Appends this lane's keys j whose bit is set in votes[j] (the warp's ballots).
  const auto append = [&](const std::uint32_t(&keys)[4], const std::uint32_t(&votes)[4]) {
    const std::uint32_t total =
        __popc(votes[0]) + __popc(votes[1]) + __popc(votes[2]) + __popc(votes[3]);
    if (total == 0) return;  // uniform across the warp
    std::uint32_t slot = 0;
    if (lane == 0) slot = atomicAdd(&s.candidate_count, total);
    slot = __shfl_sync(0xffffffffu, slot, 0);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      if ((votes[j] >> lane) & 1u)
        s.candidates[slot + __popc(votes[j] & lanes_below)] = candidate_keys::stored(keys[j], warp);
      slot += __popc(votes[j]);
    }
  };
  const auto matches = [&](std::uint32_t key) { return (key & search.mask) == search.prefix; };
  const std::uint32_t bin_top = search.prefix | ~search.mask;  // the bin's largest key
  // 1 for a key above the bin. Magnitudes (clamped or not) and so their bin tops lie below 2^31:
  // then it is the sign of bin_top - key, which the compiler adds to a count in one instruction
  // (a comparison takes a select besides the add).
  const auto is_above = [&](std::uint32_t key) -> std::uint32_t {
    if constexpr (has_unclamped_keys<KeyOf>)
      return (bin_top - key) >> 31;
    else
      return key > bin_top;
  };
  // This lane's keys in higher bins, collecting the bin's on the way.
  const auto walk = [&](const auto& keys_of) {
    std::uint32_t above = 0;
    // Whole groups, then the one the segment's end cuts short (if any).
    std::uint32_t group = 0, keys[4], votes[4];
    for (; group + emit_group <= seg.count; group += emit_group) {
      if constexpr (vector)
        keys_of.four(first + index(group, 0), keys);
      else
#pragma unroll
        for (int j = 0; j < 4; ++j) keys[j] = keys_of(first + index(group, j));
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        votes[j] = __ballot_sync(0xffffffffu, matches(keys[j]));
        above += is_above(keys[j]);
      }
      append(keys, votes);
    }
    if (group < seg.count) {
      if constexpr (vector)
        load_four_keys(keys_of, first + index(group, 0), first + seg.count, keys);
      else
#pragma unroll
        for (int j = 0; j < 4; ++j)
          keys[j] = index(group, j) < seg.count ? keys_of(first + index(group, j)) : 0;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const bool exists = index(group, j) < seg.count;
        votes[j] = __ballot_sync(0xffffffffu, exists && matches(keys[j]));
        above += exists ? is_above(keys[j]) : 0u;
      }
      append(keys, votes);
    }
    return above;
  };
  // A bin below the largest key (the usual case) holds the same keys clamped or not, and a key
  // compares with its top as its unclamped form does: one instruction fewer per key.
  std::uint32_t above = 0;
  if constexpr (has_unclamped_keys<KeyOf>)
    above = bin_top < KeyOf::largest_key ? walk(key_of.unclamped()) : walk(key_of);
  else
    above = walk(key_of);
  above = warp_sum(above);
  if (lane == 0) {
    counts.above[warp] = above;
    counts.equal[warp] = 0;
  }
}

/// Completes collect_candidates' counts once the cut `c` is found: adds each of the `collected`
/// candidates above or equal to it to its warp's count. A warp takes 32 candidates at a time and
/// adds them up owner by owner; a warp appends a group's candidates together, so a round usually
/// holds one or two owners. Called by every thread of the block.
__device__ inline void count_candidates(const candidate_keys& candidates, std::uint32_t collected,
                                        cut<std::uint32_t> c, emit_storage& counts) {
  const unsigned lane = threadIdx.x & 31u;
  for (std::uint32_t round = threadIdx.x - lane; round < collected; round += block_threads) {
    const bool exists = round + lane < collected;
    const std::uint32_t candidate = exists ? candidates.candidates[round + lane] : 0u;
    const std::uint32_t key = candidates.key(candidate);
    const unsigned owner = candidate_keys::owner(candidate);
    const bool above = exists && key > c.key, equal = exists && key == c.key;
    for (std::uint32_t pending = __ballot_sync(0xffffffffu, above || equal); pending != 0;) {
      const unsigned served = __shfl_sync(0xffffffffu, owner, __ffs(pending) - 1);
      const bool mine = owner == served;
      const auto above_count =
          static_cast<std::uint32_t>(__popc(__ballot_sync(0xffffffffu, mine && above)));
      const auto equal_count =
          static_cast<std::uint32_t>(__popc(__ballot_sync(0xffffffffu, mine && equal)));
      if (lane == 0) {
        atomicAdd(&counts.above[served], above_count);
        atomicAdd(&counts.equal[served], equal_count);
      }
      pending &= ~__ballot_sync(0xffffffffu, mine);
    }
  }
}

/// The first half of emit_selected (and block_select's, where it has no candidates to count from):
/// counts the keys above and equal to the cut in each warp's segment of [begin, end) into `s`.
/// Called by every thread of the block; ends with a barrier.
template <class Key, class KeyOf>
__device__ void count_segments(const KeyOf& key_of, cut<Key> c, std::uint64_t begin,
                               std::uint64_t end, emit_storage& s) {
  const unsigned lane = threadIdx.x & 31u, warp = threadIdx.x / 32;
  const warp_segment seg(begin, end);
  std::uint32_t above = 0, equal = 0;
  if constexpr (loads_four_keys<KeyOf>) {
    // Keys in shared memory: four consecutive ones per lane, one vector load (the order of the
    // keys does not matter to a count); 32-bit indices, `begin` a multiple of 4 (the vector
    // loads' alignment; select_chunks_kernel's ranges start at 0).
    const auto first = static_cast<std::uint32_t>(seg.first) + 4 * lane;
    std::uint32_t group = 0, keys[4];
    // Whole groups, then the one the segment's end cuts short (if any).
    for (; group + emit_group <= seg.count; group += emit_group) {
      key_of.four(first + group, keys);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        above += keys[j] > c.key;
        equal += keys[j] == c.key;
      }
    }
    if (group < seg.count) {
      load_four_keys(key_of, first + group, seg.first + seg.count, keys);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const bool exists = group + 4 * lane + j < seg.count;
        above += exists && keys[j] > c.key;
        equal += exists && keys[j] == c.key;
      }
    }
  } else {
    for (std::uint32_t group = 0; group < seg.count; group += emit_group) {
#pragma unroll
      for (int j = 0; j < emit_rounds; ++j) {
        const std::uint32_t offset = group + 32 * j + lane;
        const bool exists = offset < seg.count;
        const Key key = key_of(seg.first + (exists ? offset : 0u));  // no branch: loads overlap
        above += exists && key > c.key ? 1u : 0u;
        equal += exists && key == c.key ? 1u : 0u;
      }
    }
  }
  above = warp_sum(above);
  equal = warp_sum(equal);
  if (lane == 0) {
    s.above[warp] = above;
    s.equal[warp] = equal;
  }
  __syncthreads();
}

/// The cut keeping `k` of the `length` keys `key_of(0 .. length-1)`, whose low `32 - KeyBits` bits
/// are zero; and in `counts`, the keys above and equal to it in each warp's segment, as
/// count_segments leaves them for emit_counted. Called by every thread of the block; ends with a
/// barrier. Reads every key twice (the first pass, and the collection of candidates, which counts
/// too), or, when the candidates do not fit, once per 11-bit pass and once to count; once where
/// k is 0 or at least `length` (no search, a count).
template <int KeyBits, class KeyOf>
__device__ cut<std::uint32_t> block_select(const KeyOf& key_of, std::uint32_t length,
                                           std::uint32_t k, block_select_storage& s,
                                           emit_storage& counts) {
  if (k == 0 || k >= length) {
    const auto c = cut_without_search<std::uint32_t>(length, k);
    count_segments(key_of, c, 0, length, counts);
    return c;
  }
  cut_search<std::uint32_t> search{0, 0, length, k};
  if (threadIdx.x == 0) s.candidate_count = 0;  // read after radix_pass's barriers
  constexpr int low = 32 - chunk_digit_bits;
  if constexpr (has_unclamped_keys<KeyOf>) {
    // Magnitudes are counted unclamped, one instruction fewer per key: a NaN then falls in the bin
    // of its payload's top bits, from the bin of the NaNs' one key to that of |x|'s largest bits
    // (every other key lies below the NaNs'), and folding those bins into the first gives the
    // clamped keys' histogram.
    constexpr bin_fold nans{KeyOf::largest_key >> low, magnitude_order_max >> low};
    radix_pass<chunk_bins, block_threads, nans>(key_of.unclamped(), length, low, chunk_bins - 1,
                                                search, s.histogram, s);
  } else {
    radix_pass<chunk_bins, block_threads>(key_of, length, low, chunk_bins - 1, search, s.histogram,
                                          s);
  }
  if (search.matching <= chunk_bins) {
    const std::uint32_t collected = search.matching;
    const candidate_keys candidates{s.candidates, search.prefix};
    collect_candidates(key_of, length, search, s, counts);
    __syncthreads();
    // A few hundred candidates: warp 0 alone searches them, the other warps waiting at the barrier
    // issue nothing (the block's passes would issue eight warps' bin scans and barriers each).
    if (threadIdx.x < 32) {
      finish_search<KeyBits, candidate_digit_bits, 32>(candidates, collected, low, search,
                                                       s.candidate_histogram, s);
      if (threadIdx.x == 0) s.candidates_search = search;
    }
    __syncthreads();
    const cut<std::uint32_t> c = found_cut(s.candidates_search);
    count_candidates(candidates, collected, c, counts);
    __syncthreads();  // the counts are whole; the candidates are no longer read
    return c;
  }
  finish_search<KeyBits, chunk_digit_bits, block_threads>(key_of, length, low, search, s.histogram,
                                                          s);
  const cut<std::uint32_t> c = found_cut(search);
  count_segments(key_of, c, 0, length, counts);
  return c;
}

// ---------------------------------------------------------------------------------------------
// Emitting a cut.

/// One group of candidates as emit_counted hands it to a visitor (called by all 32 lanes of the
/// warp together). Round j of the group is the 32 candidates first + 32 j .. first + 32 j + 31;
/// this lane holds candidate first + `offset(j)` of each round. `Index` counts candidates (32 bits
/// within a chunk, so that writers address with one multiply-add).
template <class Index>
struct emitted_group {
  Index first;          // the group's first candidate
  Index slot;           // slots taken before the group since the selection's start
  std::uint32_t count;  // candidates of the group that exist (128 but in a segment's last group)
  std::uint32_t kept[emit_rounds];    // bit l: candidate first + 32 j + l is kept (the same in
                                      // every lane: round j's bitmask word)
  std::uint32_t before[emit_rounds];  // kept candidates of the group before this lane's in round j

  __device__ static std::uint32_t offset(int j) { return 32 * j + (threadIdx.x & 31u); }
  __device__ bool exists(int j) const { return offset(j) < count; }
  __device__ bool is_kept(int j) const { return (kept[j] >> (threadIdx.x & 31u)) & 1u; }
  /// Round `lane`'s bitmask word in lanes 0 .. 3 (a select, not an indexed register array).
  __device__ std::uint32_t word_of_lane() const {
    const unsigned lane = threadIdx.x & 31u;
    std::uint32_t word = kept[0];
#pragma unroll
    for (int j = 1; j < emit_rounds; ++j) word = lane == static_cast<unsigned>(j) ? kept[j] : word;
    return word;
  }
};

/// The second half of emit_selected, after count_segments (or block_select) over the same range:
/// calls `visit(group)` for its groups, in order; `above_before` / `equal_before` count the keys
/// above / equal to the cut before `begin`. `Index` holds candidate indices and slots: 32 bits
/// where the range is a chunk. A visitor that offers `specialised(emit)` (bitmask_writer, `begin`
/// a multiple of 128) picks its form for the range once, so that no group tests it. Called by every
/// thread of the block; ends with a barrier.
template <class Index = std::uint64_t, class Key, class KeyOf, class Visit>
__device__ void emit_counted(const KeyOf& key_of, cut<Key> c, std::type_identity_t<Index> begin,
                             std::type_identity_t<Index> end,
                             std::type_identity_t<Index> above_before,
                             std::type_identity_t<Index> equal_before, emit_storage& s,
                             const Visit& visit) {
  const unsigned lane = threadIdx.x & 31u, warp = threadIdx.x / 32;
  const warp_segment seg(begin, end);
  const auto first = static_cast<Index>(seg.first);
  const std::uint32_t count = seg.count;
  const auto ties = static_cast<Index>(c.ties);              // at most the range's length
  const auto compared_at_or_above = unclamped_keys(key_of);  // where every tie is kept
  const std::uint32_t lanes_below = lanes_below_mask();
  for (unsigned w = 0; w < warp; ++w) {
    above_before += s.above[w];
    equal_before += s.equal[w];
  }
  // One group: whole (128 candidates, no index tested) or the segment's last, cut short. Where the
  // cut keeps all its ties, a candidate is kept at or above its key: one ballot a round, no rank.
  const auto emit_one = [&](std::uint32_t group, auto whole_group, auto keeps_all_ties,
                            const auto& visitor) {
    constexpr bool whole = decltype(whole_group)::value;  // uniform in the warp
    constexpr bool all_ties = decltype(keeps_all_ties)::value;
    emitted_group<Index> g;
    g.first = first + group;
    g.count = whole ? emit_group : count - group;
    std::uint32_t equal_votes[emit_rounds], above_total = 0, equal_total = 0;
#pragma unroll
    for (int j = 0; j < emit_rounds; ++j) {
      const std::uint32_t offset = 32 * j + lane;
      const bool exists = whole || offset < g.count;
      const Index i = g.first + (exists ? offset : 0u);  // no branch: the loads overlap
      const Key key = all_ties ? compared_at_or_above(i) : key_of(i);
      // With every tie kept, "above" counts the ties too: the slots are the same.
      g.kept[j] = __ballot_sync(0xffffffffu, exists && (all_ties ? key >= c.key : key > c.key));
      above_total += __popc(g.kept[j]);
      if constexpr (!all_ties) {
        equal_votes[j] = __ballot_sync(0xffffffffu, exists && key == c.key);
        equal_total += __popc(equal_votes[j]);
      }
    }
    // The ties kept are the first ones: those of rank below c.ties. (Only where the cut splits its
    // ties, or keeps none.)
    if constexpr (!all_ties) {
      if (equal_total != 0 && equal_before < ties) {  // uniform in the warp
        Index rank = equal_before;
#pragma unroll
        for (int j = 0; j < emit_rounds; ++j) {
          const bool tie = (equal_votes[j] >> lane) & 1u;
          g.kept[j] |=
              __ballot_sync(0xffffffffu, tie && rank + __popc(equal_votes[j] & lanes_below) < ties);
          rank += __popc(equal_votes[j]);
        }
      }
    }
    std::uint32_t kept_before = 0;
#pragma unroll
    for (int j = 0; j < emit_rounds; ++j) {
      g.before[j] = kept_before + __popc(g.kept[j] & lanes_below);
      kept_before += __popc(g.kept[j]);
    }
    g.slot = above_before + (equal_before < ties ? equal_before : ties);
    visitor(g);
    above_before += above_total;
    equal_before += equal_total;
  };
  const auto emit_all = [&](auto keeps_all_ties, const auto& visitor) {
    std::uint32_t group = 0;
    for (; group + emit_group <= count; group += emit_group)
      emit_one(group, std::true_type{}, keeps_all_ties, visitor);
    if (group < count) emit_one(group, std::false_type{}, keeps_all_ties, visitor);
  };
  const auto emit_with = [&](const auto& visitor) {
    if (c.all_ties)  // uniform in the block
      emit_all(std::true_type{}, visitor);
    else
      emit_all(std::false_type{}, visitor);
  };
  if constexpr (requires { visit.specialised(emit_with); })
    visit.specialised(emit_with);
  else
    emit_with(visit);
  __syncthreads();  // before the counts are written again
}

/// Calls `visit(group)` (an emitted_group) for the candidates [begin, end), 128 at a time and in
/// order; `above_before` / `equal_before` count the keys above / equal to the cut before `begin`.
/// Every warp takes one segment of whole 128-candidate groups: it counts its keys above and equal
/// to the cut, the block adds up the counts of the warps before it, and then it walks its segment
/// a group at a time, where the warp ballots of each round give every kept candidate its slot — no
/// block-wide scan per group. Reads every key twice; called by every thread of the block; `begin`
/// a multiple of 128 for bitmask writers (a group's mask words then start a 16-byte vector
/// wherever the writer's words do). `Index`: as emit_counted's.
template <class Index = std::uint64_t, class Key, class KeyOf, class Visit>
__device__ void emit_selected(const KeyOf& key_of, cut<Key> c, std::type_identity_t<Index> begin,
                              std::type_identity_t<Index> end,
                              std::type_identity_t<Index> above_before,
                              std::type_identity_t<Index> equal_before, emit_storage& s,
                              const Visit& visit) {
  count_segments(key_of, c, begin, end, s);
  emit_counted<Index>(key_of, c, begin, end, above_before, equal_before, s, visit);
}

// ---------------------------------------------------------------------------------------------
// Visitors of emit_counted. Each describes one chunk (pointers already at the chunk's start);
// `at(layout, chunk)` moves a whole-cache visitor to a chunk.

/// Values only (seeded caches).
template <class T>
struct value_writer {
  const T* data;
  T* values;
  __device__ value_writer at(const cache_layout& layout, std::int64_t chunk) const {
    return {data + layout.chunk_begin(chunk),
            global_address_once(values + layout.values_begin(chunk))};
  }
  template <class Group>
  __device__ void operator()(const Group& g) const {
    const T* in = data + g.first;  // 32-bit offsets from the group's first candidate and slot
    T* const out = global_address_once(values + g.slot);
#pragma unroll
    for (int j = 0; j < emit_rounds; ++j)
      if (g.is_kept(j)) out[g.before[j]] = in[g.offset(j)];
  }
};

/// Values and one LSB-first mask word per 32 candidates. `AlignedWords`: `words` lies on 16 bytes,
/// so a whole group's four words are one store (the form `specialised` picks where it can).
template <class T, bool AlignedWords = false>
struct bitmask_writer {
  const T* data;
  T* values;
  std::uint32_t* words;
  __device__ bitmask_writer at(const cache_layout& layout, std::int64_t chunk) const {
    return {data + layout.chunk_begin(chunk),
            global_address_once(values + layout.values_begin(chunk)),
            global_address_once(words + layout.mask_word_begin(chunk))};
  }
  /// `emit(writer)` with this writer, or its aligned form where the words allow.
  template <class Emit>
  __device__ void specialised(const Emit& emit) const {
    if (reinterpret_cast<std::uintptr_t>(words) % sizeof(four_items<std::uint32_t>) == 0)
      emit(bitmask_writer<T, true>{data, values, words});
    else
      emit(*this);
  }
  template <class Group>
  __device__ void operator()(const Group& g) const {
    static_assert(emit_rounds == 4, "a whole group's words are one four_items store");
    value_writer<T>{data, values}(g);
    const unsigned lane = threadIdx.x & 31u;
    if (AlignedWords && g.count == emit_group) {  // uniform: groups start at multiples of 128
      if (lane == 0)
        *reinterpret_cast<four_items<std::uint32_t>*>(words + g.first / 32) = {
            {g.kept[0], g.kept[1], g.kept[2], g.kept[3]}};
      return;
    }
    // Lane j < 4 stores round j's ballot, word j of the group, if its first candidate exists.
    const std::uint32_t word = g.word_of_lane();
    if (lane < emit_rounds && 32 * lane < g.count) words[g.first / 32 + lane] = word;
  }
};

/// Values and their offsets within the chunk (16 or 32 bits).
template <class T, class Offset>
struct offset_writer {
  const T* data;
  T* values;
  Offset* offsets;
  __device__ offset_writer at(const cache_layout& layout, std::int64_t chunk) const {
    return {data + layout.chunk_begin(chunk),
            global_address_once(values + layout.values_begin(chunk)),
            global_address_once(offsets + layout.values_begin(chunk))};
  }
  template <class Group>
  __device__ void operator()(const Group& g) const {
    T* const out = global_address_once(values + g.slot);
    Offset* const out_offsets = global_address_once(offsets + g.slot);
#pragma unroll
    for (int j = 0; j < emit_rounds; ++j) {
      if (g.is_kept(j)) {
        out[g.before[j]] = data[g.first + g.offset(j)];
        out_offsets[g.before[j]] = static_cast<Offset>(g.first + g.offset(j));
      }
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
    return {values + layout.values_begin(chunk),
            global_address_once(out + layout.chunk_begin(chunk)), layout.rescale,
            layout.value_scale(chunk)};
  }
  template <class Group>
  __device__ void operator()(const Group& g) const {
    const T* in = values + g.slot;
    Out* dense = out + g.first;
#pragma unroll
    for (int j = 0; j < emit_rounds; ++j) {
      if (g.exists(j))
        dense[g.offset(j)] = g.is_kept(j) ? densified<Out>(in[g.before[j]], rescale, scale) : Out{};
    }
  }
};

/// The ascending list of kept candidates (channels).
struct index_writer {
  std::uint32_t* list;
  template <class Group>
  __device__ void operator()(const Group& g) const {
#pragma unroll
    for (int j = 0; j < emit_rounds; ++j)
      if (g.is_kept(j))
        list[g.slot + g.before[j]] = static_cast<std::uint32_t>(g.first + g.offset(j));
  }
};

}  // namespace dropit::detail::cuda
