#pragma once
// The CUDA backend's kernels: thin wrappers over the block-level code of select.cuh plus the
// element-wise and reduction kernels of densify, channel selection and the weight gradients. Every
// kernel runs `block_threads` threads per block and loops grid-stride, so any grid is correct.
// Every kernel is a template (`template <class = void>` where nothing varies), so that any number
// of translation units may include this header: a non-template kernel would be defined in each.
//
// Kernel by kernel (the host code in cache_ops.cuh / weight_grad.cuh strings them together):
// - select_chunks: one block per chunk: the chunk staged in shared memory (one read, 16-byte
//   asynchronous copies), block_select (an 11-bit radix histogram pass in shared memory over
//   every key, then the keys of the bin holding the cut collected, each warp's keys in higher
//   bins counted on the way, and 8-bit passes over those candidates by one warp) then
//   emit_counted (128 candidates per warp at a time, in four rounds of one ballot each), writing
//   values and bitmask / offsets, or the dense chunk of a seeded cache.
// - select_range: a whole-tensor (or all-channel) selection in one cooperative launch, grid-wide
//   barriers between its phases. Each pass decides 12 bits of the cut: every block counts its
//   keys' digit into a 4096-bin shared histogram and adds it to a global one, and the last block
//   to finish picks the digit holding the cut; a pass whose starting bin fits a buffer copies its
//   keys there for the later passes. The emit takes spans of `span_size` candidates in order,
//   counts each span's keys above / equal to the cut, learns the counts before it by decoupled
//   look-back (lookback.cuh), and emits its kept candidates at their global slots
//   (emit_selected's two halves).
// - chunk_densify: one block per chunk of a bitmask cache: the chunk's word popcounts scanned in
//   shared memory, then four elements per thread and vector store.
// - mask_densify: a tile of 256 mask words per block, its popcounts scanned in the block and the
//   set bits before it learnt by look-back, then one warp per word writes its 32 dense elements
//   (kept value or zero): chunks longer than chunk_densify takes (min-k over the whole tensor).
// - chunk_scatter_offsets / tile_scatter_offsets: a block per chunk (16-bit offsets) or per tile
//   of 2^14 elements (32-bit offsets, one chunk) zeroes it, then writes its kept values.
// - channel_run_sums / channel_keys: channel scores in the canonical order of
//   `channel_score_block` (one thread per run of 1024 elements, then one per channel), as 64-bit
//   keys ordered like the CPU backend's ranking (NaN highest); up to 2^13 channels
//   channel_min_k_compress runs the sums, the keys and their selection (in one block) and the
//   gather in one cooperative launch.
// - channel_gather / channel_map / channel_densify: copies of kept channels in and out (the
//   channel -> slot map of densify built in each block's shared memory up to 2^13 channels).
// - linear_weight_grad: a 16x16-tiled dW = dZ^T A over the densified float A.
// - conv2d_weight_grad: one block per dW element, a block reduction over (n, oh, ow) (for 16-bit
//   caches with n/k rescaling only).
// - conv2d_columns / conv2d_dz_rows / store_gradient: the im2col block of a range of samples and
//   their dZ rows, the operands of the cuBLAS conv2d weight gradient; its float sum stored into dW.
// - pack_relu_mask / apply_relu_mask: one warp vote per mask word; one thread per element.
// - their channels-last forms: a block per tile of 32 pixels by 32 channels (a shared-memory
//   transpose, then one vote per channel's word).
// - transpose_channels_last: the same tiles, copied into logical order for compress (a
//   channels-last input is selected as its contiguous copy in the workspace).

#include <cooperative_groups.h>
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include <cstdint>
#include <type_traits>

#include "../common/geometry.hpp"
#include "../common/index_walk.hpp"
#include "../common/keys.hpp"
#include "../common/relu_mask.hpp"
#include "common.cuh"
#include "lookback.cuh"
#include "select.cuh"

namespace dropit::detail::cuda {

// ---------------------------------------------------------------------------------------------
// Chunks, one per block.

/// What a staged chunk keeps in shared memory: its values (selections that rank values: keys are
/// recomputed from them in two instructions, and the writers copy kept values from there), or its
/// generator draws (4 bytes each).
template <class T, class Selection>
using staged_item = std::conditional_t<selection_traits<Selection>::ranks_values, T, std::uint32_t>;

/// Copies `length` values from `data` to shared memory `staged`: 16 bytes per thread and load,
/// asynchronously (no registers held, every load of the block in flight at once) where the chunk
/// is 16-byte aligned.
template <class T>
__device__ void stage_values(const T* data, std::uint32_t length, T* staged) {
  constexpr std::uint32_t per_vector = 16 / sizeof(T);
  const bool aligned = reinterpret_cast<std::uintptr_t>(data) % 16 == 0;
  const std::uint32_t vectors = aligned ? length / per_vector : 0;
  for (std::uint32_t v = threadIdx.x; v < vectors; v += block_threads)
    copy_16_bytes_async(staged + v * per_vector, data + v * per_vector);
  for (std::uint32_t i = vectors * per_vector + threadIdx.x; i < length; i += block_threads)
    staged[i] = data[i];
  wait_for_async_copies();
}

/// Keys from `Selection` (values of `input`, or draws of stream `chunk`).
/// `Writer::at(layout, chunk)` gives the chunk's visitor.
///
/// `Staged`: the chunk is read once, into dynamic shared memory (`chunk_size` staged items,
/// launched with that many bytes), and the radix passes, the emit and the writers read it there.
/// Otherwise every radix pass and the emit recompute the keys from global memory (for chunks too
/// long for shared memory).
template <class T, class Selection, bool Staged, class Writer>
DROPIT_KERNEL void select_chunks_kernel(cache_layout layout, const T* input, Writer writer) {
  using traits = selection_traits<Selection>;
  using item = staged_item<T, Selection>;
  // Magnitudes of 16-bit types are keys with 16 zero low bits: one radix pass fewer.
  constexpr int key_bits = traits::ranks_values ? magnitude_key_bits<T> : 32;
  __shared__ block_select_storage select_storage;
  __shared__ emit_storage emit;
  item* const staged = dynamic_shared_memory<item>();
  // Chunk by chunk without the layout's counts, which divide (a 64-bit division is a call whose
  // results, live across the loop, spill on sm_80).
  const std::int64_t numel = layout.numel();
  if (layout.chunk_size <= 0) return;  // no chunks (plan_cache gives every chunked layout one)
  for (std::int64_t chunk = blockIdx.x; chunk * layout.chunk_size < numel; chunk += gridDim.x) {
    const std::int64_t left = numel - chunk * layout.chunk_size;
    const bool full = left >= layout.chunk_size;
    const auto length = static_cast<std::uint32_t>(full ? layout.chunk_size : left);
    const auto k = static_cast<std::uint32_t>(full ? layout.kept_per_chunk : layout.kept_per_tail);
    auto visit = writer.at(layout, chunk);
    const T* data = traits::ranks_values ? input + layout.chunk_begin(chunk) : nullptr;
    const selection_keys<Selection, T> key_of{data, layout.seed, static_cast<std::uint64_t>(chunk)};
    if constexpr (Staged) {
      __syncthreads();  // the previous chunk's items are no longer read
      if constexpr (traits::ranks_values) {
        stage_values(data, length, staged);
        visit.data = staged;  // kept values are copied from shared memory
      } else {
        for (std::uint32_t i = threadIdx.x; i < length; i += block_threads) staged[i] = key_of(i);
      }
      __syncthreads();
      const staged_keys<Selection, item> keys{staged};
      const cut<std::uint32_t> c = block_select<key_bits>(keys, length, k, select_storage, emit);
      emit_counted<std::uint32_t>(keys, c, 0, length, 0, 0, emit, visit);
    } else {
      const cut<std::uint32_t> c = block_select<key_bits>(key_of, length, k, select_storage, emit);
      emit_counted<std::uint32_t>(key_of, c, 0, length, 0, 0, emit, visit);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Whole-range selection over many blocks.

/// Candidates per span of the emit (a multiple of its 128-candidate groups): the tiles of its
/// look-back scan.
inline constexpr std::int64_t span_size = std::int64_t{1} << 14;

/// The passes of a whole-range selection decide 12 bits at a time (the last pass the bits left):
/// a 4096-bin histogram, 16 KiB of shared memory per block. Magnitudes of 16-bit types take two
/// passes, of float three, 64-bit channel scores six.
inline constexpr int range_digit_bits = 12;
inline constexpr std::uint32_t range_bins = 1u << range_digit_bits;

/// The passes over keys of type `Key` whose top `KeyBits` bits vary: pass p decides the bits
/// [shift(p), shift(p) + bits(p)), from the top down.
template <class Key, int KeyBits>
struct range_digits {
  static constexpr int width = 8 * static_cast<int>(sizeof(Key));
  static constexpr int passes = (KeyBits + range_digit_bits - 1) / range_digit_bits;
  __host__ __device__ static constexpr int shift(int pass) {
    const int shift = width - (pass + 1) * range_digit_bits;
    return shift > width - KeyBits ? shift : width - KeyBits;
  }
  __host__ __device__ static constexpr int bits(int pass) {
    return (pass == 0 ? width : shift(pass - 1)) - shift(pass);
  }
  __host__ __device__ static constexpr std::uint32_t digit_mask(int pass) {
    return (1u << bits(pass)) - 1u;
  }
};

/// Ranges of at most this many candidates are selected by one block in one launch: every pass
/// and the emit read the keys from global memory (L2) — channel scores and small tensors, whose
/// passes take less time than the launches of the multi-block passes would.
inline constexpr std::int64_t range_in_block_limit = std::int64_t{1} << 13;

/// Keys a block gathers in shared memory before it copies them to the candidate buffer with one
/// global atomic: at most one per block iteration of `range_block_items` keys and one at the end,
/// where one per warp and 128 keys would queue hundreds of thousands on one address.
inline constexpr std::uint32_t range_block_items = emit_group * block_warps;
inline constexpr std::uint32_t range_staged_keys = 2 * range_block_items;

/// Where the passes stand, written by each pass's last block and read by the next pass.
template <class Key>
struct range_state {
  cut_search<Key> search;
  std::uint32_t collected;  // keys in the candidate buffer, when from_candidates
  bool from_candidates;     // later passes read the candidate buffer, not the range
};

/// What the passes of a whole-range selection share, in the caller's workspace.
template <class Key>
struct range_select_scratch {
  range_state<Key>* state;
  std::uint32_t* histogram;  // range_bins, zero when a pass starts
  std::uint32_t* counters;   // [0]: blocks done with the pass; [1]: keys collected (zero at first)
  Key* candidates;           // `capacity` keys
  std::uint32_t capacity;
};

template <class Key>
struct range_collect_storage {
  Key keys[range_staged_keys];
  std::uint32_t fill, base;
};

/// Copies the keys a block has gathered to the candidate buffer. Called by every thread of the
/// block after a barrier.
template <class Key>
__device__ void flush_collected(range_collect_storage<Key>& c, const range_select_scratch<Key>& s) {
  const std::uint32_t fill = c.fill;
  if (fill == 0) return;  // uniform: no thread writes `fill` between the barrier and here
  if (threadIdx.x == 0) c.base = atomicAdd(&s.counters[1], fill);
  __syncthreads();
  for (std::uint32_t i = threadIdx.x; i < fill; i += block_threads)
    s.candidates[c.base + i] = c.keys[i];
  __syncthreads();
  if (threadIdx.x == 0) c.fill = 0;
  __syncthreads();
}

/// One pass's count over `length` keys: the digit at `shift` of each key matching the search's
/// prefix into `histogram` (digit 0 uncounted, see pick_digit), and with `Collect` a copy of each
/// matching key in the candidate buffer (through `c`, into `s`'s buffer). The block is number
/// `block` of the `blocks` sharing the keys (blockIdx.x and gridDim.x, or 0 and 1 where a block of
/// a larger grid counts alone) and takes their iterations of `range_block_items` keys round-robin.
/// Each warp takes 128 consecutive keys per block iteration, in four rounds of 32 coalesced loads
/// issued before any is counted. Called by every thread of the block.
template <bool Collect, class Key, class KeyOf>
__device__ void count_range_digits(const KeyOf& key_of, std::uint64_t length, std::uint32_t block,
                                   std::uint32_t blocks, const cut_search<Key>& search, int shift,
                                   std::uint32_t digit_mask, std::uint32_t* histogram,
                                   range_collect_storage<Key>* c,
                                   const range_select_scratch<Key>* s) {
  const unsigned lane = threadIdx.x & 31u, warp = threadIdx.x / 32;
  const std::uint32_t lanes_below = lanes_below_mask();
  for (std::uint64_t base = std::uint64_t{block} * range_block_items; base < length;
       base += std::uint64_t{blocks} * range_block_items) {  // uniform in the block
    const std::uint64_t group = base + warp * emit_group;
    Key keys[emit_rounds];
#pragma unroll
    for (int j = 0; j < emit_rounds; ++j) {
      const std::uint64_t i = group + 32 * j + lane;
      keys[j] = key_of(i < length ? i : 0u);  // no branch: the loads overlap
    }
    std::uint32_t votes[emit_rounds], total = 0;
#pragma unroll
    for (int j = 0; j < emit_rounds; ++j) {
      const bool match = group + 32 * j + lane < length && (keys[j] & search.mask) == search.prefix;
      const auto digit = static_cast<std::uint32_t>(keys[j] >> shift) & digit_mask;
      // A bin for each lane, or none (digit 0 and keys outside the prefix count nowhere). Where
      // the whole round falls into one bin (a tie across 32 keys: a constant or saturated
      // stretch), one atomic adds 32 instead of 32 serialised on one address.
      const std::uint32_t bin = match && digit != 0 ? digit : 0u;
      if (__all_sync(0xffffffffu, bin == __shfl_sync(0xffffffffu, bin, 0))) {
        if (lane == 0 && bin != 0) atomicAdd(&histogram[bin], 32u);
      } else if (bin != 0) {
        atomicAdd(&histogram[bin], 1u);
      }
      votes[j] = __ballot_sync(0xffffffffu, match);
      total += __popc(votes[j]);
    }
    if constexpr (Collect) {
      std::uint32_t slot = 0;
      if (lane == 0 && total != 0) slot = atomicAdd(&c->fill, total);
      slot = __shfl_sync(0xffffffffu, slot, 0);
#pragma unroll
      for (int j = 0; j < emit_rounds; ++j) {
        if ((votes[j] >> lane) & 1u) c->keys[slot + __popc(votes[j] & lanes_below)] = keys[j];
        slot += __popc(votes[j]);
      }
      __syncthreads();
      const bool full = c->fill > range_staged_keys - range_block_items;
      __syncthreads();  // every thread has read `fill` before the next iteration adds to it
      if (full) flush_collected(*c, *s);
    }
  }
  if constexpr (Collect) {
    __syncthreads();
    flush_collected(*c, *s);
  }
}

/// A block's shared memory for a pass of the whole-range selection.
template <class Key>
struct range_pass_storage {
  std::uint32_t histogram[range_bins];
  range_collect_storage<Key> collect;
  digit_pick_storage pick;
  bool last_block;
};

/// Pass `pass` of the whole-range selection over the keys `key_of(0 .. m-1)` (range_digits):
/// decides its digit among the keys matching the digits decided before. The first pass starts the
/// search for the `k` largest, 0 < k < m < 2^32. Every block adds its shared histogram to the
/// global one; the last block to finish picks the digit holding the cut, updates the state and
/// clears the histogram and its counter for the next pass, which must not start before it has
/// (a grid-wide barrier). Called by every thread of every block.
///
/// A pass reads every key — or, once a pass has collected them, only the keys of the bin holding
/// the cut: a pass other than the last collects the keys matching the prefix it starts from when
/// they fit the candidate buffer (a sixteenth of a long range: a bin of a float magnitude's first
/// 12 bits is an eighth of an octave, a few percent of a tensor around the cut).
template <class Key, int KeyBits, class KeyOf>
__device__ void select_range_pass(const KeyOf& key_of, std::uint32_t m, std::uint32_t k, int pass,
                                  const range_select_scratch<Key>& s,
                                  range_pass_storage<Key>& storage) {
  using digits = range_digits<Key, KeyBits>;
  const range_state<Key> state =
      pass == 0 ? range_state<Key>{{Key{0}, Key{0}, m, k}, 0u, false} : *s.state;
  cut_search<Key> search = state.search;
  const int shift = digits::shift(pass);
  const std::uint32_t digit_mask = digits::digit_mask(pass);
  const bool collect =
      !state.from_candidates && pass + 1 < digits::passes && search.matching <= s.capacity;
  for (std::uint32_t b = threadIdx.x; b < range_bins; b += block_threads) storage.histogram[b] = 0;
  if (threadIdx.x == 0) storage.collect.fill = 0;
  __syncthreads();
  if (state.from_candidates)
    count_range_digits<false>(stored_keys<Key>{s.candidates}, state.collected, blockIdx.x,
                              gridDim.x, search, shift, digit_mask, storage.histogram,
                              &storage.collect, &s);
  else if (collect)
    count_range_digits<true>(key_of, m, blockIdx.x, gridDim.x, search, shift, digit_mask,
                             storage.histogram, &storage.collect, &s);
  else
    count_range_digits<false>(key_of, m, blockIdx.x, gridDim.x, search, shift, digit_mask,
                              storage.histogram, &storage.collect, &s);
  __syncthreads();
  for (std::uint32_t b = threadIdx.x; b < range_bins; b += block_threads)
    if (storage.histogram[b] != 0) atomicAdd(&s.histogram[b], storage.histogram[b]);
  __threadfence();  // this block's counts reach the device before its ticket
  __syncthreads();
  if (threadIdx.x == 0)
    storage.last_block =
        device_atomic_word(s.counters[0]).fetch_add(1u, ::cuda::memory_order_acq_rel) ==
        gridDim.x - 1;
  __syncthreads();
  if (!storage.last_block) return;
  __threadfence();  // every other block's counts are seen
  pick_digit<range_bins>([&](std::uint32_t bin) { return __ldcg(&s.histogram[bin]); }, shift,
                         digit_mask, search, storage.pick);
  for (std::uint32_t b = threadIdx.x; b < range_bins; b += block_threads) s.histogram[b] = 0;
  if (threadIdx.x == 0) {
    *s.state = {search, collect ? state.search.matching : state.collected,
                state.from_candidates || collect};
    s.counters[0] = 0;
  }
}

struct range_in_block_storage {
  std::uint32_t histogram[range_bins];
  digit_pick_storage pick;
  emit_storage emit;
};

/// A whole-range selection of at most range_in_block_limit candidates in one block: the passes
/// of select_range_pass, each over every key and picked in the block, then emit_selected
/// over the whole range; the cut keeps all (key 0, every tie) where k >= m. Called by every thread
/// of one block, which reads every key whatever the grid (channel_min_k_compress's first block).
template <class Key, int KeyBits, class KeyOf, class Writer>
__device__ void select_range_in_block(const KeyOf& key_of, std::uint32_t m, std::uint32_t k,
                                      const Writer& visit, range_in_block_storage& s) {
  using digits = range_digits<Key, KeyBits>;
  cut_search<Key> search{Key{0}, Key{0}, m, k};
  cut<Key> c = cut_without_search<Key>(m, k);
  if (0 < k && k < m) {
    for (int pass = 0; pass < digits::passes; ++pass) {
      for (std::uint32_t b = threadIdx.x; b < range_bins; b += block_threads) s.histogram[b] = 0;
      __syncthreads();
      count_range_digits<false>(key_of, m, 0, 1, search, digits::shift(pass),
                                digits::digit_mask(pass), s.histogram,
                                static_cast<range_collect_storage<Key>*>(nullptr),
                                static_cast<const range_select_scratch<Key>*>(nullptr));
      __syncthreads();
      // pick_digit ends with a barrier: the histogram is cleared after every thread read it.
      pick_digit<range_bins>([&](std::uint32_t bin) { return s.histogram[bin]; },
                             digits::shift(pass), digits::digit_mask(pass), search, s.pick);
    }
    c = found_cut(search);
  }
  emit_selected(key_of, c, 0, m, 0, 0, s.emit, visit);
}

template <class Key, int KeyBits, class KeyOf, class Writer>
DROPIT_KERNEL void select_range_in_block_kernel(KeyOf key_of, std::uint32_t m, std::uint32_t k,
                                                Writer visit) {
  __shared__ range_in_block_storage storage;
  select_range_in_block<Key, KeyBits>(key_of, m, k, visit, storage);
}

/// A block's shared memory for the emit of the whole-range selection.
struct range_emit_storage {
  emit_storage emit;
  std::uint32_t ticket;
  std::uint64_t before;  // (above << 32) | equal: totals fit, m < 2^32
};

/// Emits the cut `c` of a whole-range selection span by span: each span counts its keys above and
/// equal to the cut, learns the counts of the spans before it by look-back, and emits
/// (emit_selected's two halves). Reads every key twice, the second time from L2 (a span is 64 KiB
/// of float). Called by every thread of every block.
template <class Key, class KeyOf, class Writer>
__device__ void select_range_emit(const KeyOf& key_of, std::uint64_t m, const cut<Key>& c,
                                  const lookback_tiles& spans, const Writer& visit,
                                  range_emit_storage& storage) {
  const std::uint64_t span_count = (m + span_size - 1) / span_size;
  for (std::uint32_t span = next_tile(spans, storage.ticket); span < span_count;
       span = next_tile(spans, storage.ticket)) {
    const std::uint64_t begin = span * span_size;
    const std::uint64_t end = begin + span_size < m ? begin + span_size : m;
    count_segments(key_of, c, begin, end, storage.emit);
    if (threadIdx.x < 32) {
      std::uint64_t total = 0;
      for (int w = 0; w < block_warps; ++w)
        total += (std::uint64_t{storage.emit.above[w]} << 32) | storage.emit.equal[w];
      const std::uint64_t prefix = exclusive_prefix(spans, span, total);
      if (threadIdx.x == 0) storage.before = prefix;
    }
    __syncthreads();
    emit_counted(key_of, c, begin, end, storage.before >> 32, storage.before & 0xffffffffu,
                 storage.emit, visit);
  }
}

/// A whole-range selection of the `k` largest of `m` keys (range_in_block_limit < m < 2^32) in
/// one cooperative launch: every block resident at once, grid-wide barriers between the phases
/// where separate launches followed one another. The blocks clear the `zeroed_words` words of
/// `zeroed` (the passes' histogram and counters, the emit's look-back words), then run each pass
/// of select_range_pass where 0 < k < m (else the cut needs no search), then select_range_emit.
/// Any grid is correct; more blocks than the device holds at once cannot be launched. Registers
/// are budgeted for five blocks per multiprocessor, as the separate pass and emit kernels ran:
/// left to itself, ptxas kept as many registers and spilled an address it had hoisted.
template <class Key, int KeyBits, class KeyOf, class Writer>
DROPIT_KERNEL_RESIDENT(5)
void select_range_kernel(KeyOf key_of, std::uint32_t m, std::uint32_t k,
                         range_select_scratch<Key> s, std::uint32_t* zeroed,
                         std::uint32_t zeroed_words, lookback_tiles spans, Writer visit) {
  __shared__ union {  // the passes' and the emit's, one after the other
    range_pass_storage<Key> pass;
    range_emit_storage emit;
  } storage;
  const cooperative_groups::grid_group grid = cooperative_groups::this_grid();
  for (std::uint32_t w = blockIdx.x * block_threads + threadIdx.x; w < zeroed_words;
       w += gridDim.x * block_threads)
    zeroed[w] = 0;
  grid.sync();
  cut<Key> c = cut_without_search<Key>(m, k);
  if (0 < k && k < m) {
    for (int pass = 0; pass < range_digits<Key, KeyBits>::passes; ++pass) {
      select_range_pass<Key, KeyBits>(key_of, m, k, pass, s, storage.pass);
      grid.sync();  // the pass's digit is picked and its histogram cleared
    }
    c = found_cut(s.state->search);
  }
  select_range_emit(key_of, std::uint64_t{m}, c, spans, visit, storage.emit);
}

// ---------------------------------------------------------------------------------------------
// Densify of bitmask and offsets caches.

inline constexpr std::int64_t mask_words_per_block = block_threads;

/// Writes every element a bitmask cache covers, for caches whose chunks are longer than
/// chunk_densify_kernel takes (min-k over the whole tensor), in one launch. Word w of the mask
/// buffer is word w % words_per_chunk of chunk w / words_per_chunk, and the chunks' values follow
/// each other, so the scan of set bits over the whole buffer is each kept value's index: each
/// tile of `mask_words_per_block` words scans its popcounts in the block and learns the set bits
/// before it by look-back; then one warp per word writes its 32 dense elements.
template <class T, class Out>
DROPIT_KERNEL void mask_densify_kernel(cache_layout layout, const std::uint32_t* words,
                                       std::int64_t word_count, lookback_tiles tiles,
                                       const T* values, Out* out) {
  using scan_t = cub::BlockScan<std::uint32_t, block_threads>;
  __shared__ typename scan_t::TempStorage scan;
  __shared__ std::uint32_t word_bits[mask_words_per_block];
  __shared__ std::uint32_t word_first[mask_words_per_block];  // set bits before the word
  __shared__ std::uint32_t ticket;
  __shared__ std::uint64_t tile_first;  // set bits before the tile
  const unsigned lane = threadIdx.x & 31u, warp = threadIdx.x / 32;
  const std::int64_t tile_count = (word_count + mask_words_per_block - 1) / mask_words_per_block;
  // What the per-element loop needs of the layout, read once: its accessors recompute numel()
  // and divide on every call.
  const std::int64_t words_per_chunk = layout.mask_words_per_chunk();
  const std::int64_t full_chunks = layout.full_chunk_count(), tail = layout.tail_size();
  const float full_scale = layout.value_scale(0), tail_scale = layout.value_scale(full_chunks);
  for (std::int64_t b = next_tile(tiles, ticket); b < tile_count; b = next_tile(tiles, ticket)) {
    const std::int64_t first_word = b * mask_words_per_block;
    const std::int64_t w = first_word + threadIdx.x;
    const std::uint32_t bits = w < word_count ? words[w] : 0u;
    std::uint32_t before = 0, set_in_tile = 0;
    scan_t(scan).ExclusiveSum(static_cast<std::uint32_t>(__popc(bits)), before, set_in_tile);
    word_bits[threadIdx.x] = bits;
    word_first[threadIdx.x] = before;
    if (threadIdx.x < 32) {
      const std::uint64_t prefix =
          exclusive_prefix(tiles, static_cast<std::uint32_t>(b), set_in_tile);
      if (threadIdx.x == 0) tile_first = prefix;
    }
    __syncthreads();
    const std::uint64_t block_first = tile_first;
    // The tile's first word split into (chunk, word in chunk) once: a chunk holds more words than
    // a tile (chunk_densify takes the caches whose chunks hold at most 2048), so a word of the
    // tile lies in that chunk or the next.
    const std::int64_t tile_chunk = first_word / words_per_chunk;
    const std::int64_t tile_word_in_chunk = first_word - tile_chunk * words_per_chunk;
    for (std::int64_t j = warp; j < mask_words_per_block; j += block_threads / 32) {
      const std::int64_t word = first_word + j;
      if (word >= word_count) break;  // uniform across the warp
      std::int64_t chunk = tile_chunk, word_in_chunk = tile_word_in_chunk + j;
      if (word_in_chunk >= words_per_chunk) {
        word_in_chunk -= words_per_chunk;
        ++chunk;
      }
      const bool in_tail = chunk == full_chunks;
      const std::int64_t position = word_in_chunk * 32 + lane;
      if (position >= (in_tail ? tail : layout.chunk_size)) continue;
      const std::uint32_t word_value = word_bits[j];
      Out result{};
      if ((word_value >> lane) & 1u) {
        const std::uint64_t index =
            block_first + word_first[j] + __popc(word_value & ((1u << lane) - 1u));
        result = densified<Out>(values[index], layout.rescale, in_tail ? tail_scale : full_scale);
      }
      out[chunk * layout.chunk_size + position] = result;
    }
    // next_tile's barrier comes before word_bits, word_first and the scan storage are reused.
  }
}

/// Mask words of a chunk that chunk_densify_kernel holds in shared memory: 2^16 candidates (the
/// longest chunk of the chunked selections).
inline constexpr std::int64_t max_chunk_mask_words = std::int64_t{1} << 11;

/// Writes every element of a bitmask cache whose chunks have at most max_chunk_mask_words words,
/// in one launch: one block per chunk (the chunk's values start at values_begin, so no scan
/// crosses chunks). The block loads the chunk's words once and scans their popcounts; then each
/// thread writes 16 bytes of consecutive elements (four float, eight 16-bit) with one vector store
/// where the chunk is aligned: with 8-byte stores of four 16-bit elements, half the bytes were in
/// flight per thread and bfloat16 densify ran at 50 % of a device copy's bandwidth (H100).
template <class T, class Out>
DROPIT_KERNEL void chunk_densify_kernel(cache_layout layout, const std::uint32_t* words,
                                        const T* values, Out* out) {
  constexpr int words_per_thread = max_chunk_mask_words / block_threads;
  using scan_t = cub::BlockScan<std::uint32_t, block_threads>;
  __shared__ typename scan_t::TempStorage scan;
  __shared__ std::uint32_t word_bits[max_chunk_mask_words];
  __shared__ std::uint32_t word_first[max_chunk_mask_words];  // set bits before the word
  const std::int64_t chunks = layout.chunk_count();
  for (std::int64_t chunk = blockIdx.x; chunk < chunks; chunk += gridDim.x) {
    const auto length = static_cast<std::uint32_t>(layout.chunk_length(chunk));
    const std::uint32_t word_count = (length + 31) / 32;
    const std::uint32_t* chunk_words = words + layout.mask_word_begin(chunk);
    // Thread t scans words [t * words_per_thread, (t + 1) * words_per_thread).
    std::uint32_t bits[words_per_thread];
    std::uint32_t set = 0;
#pragma unroll
    for (int j = 0; j < words_per_thread; ++j) {
      const std::uint32_t w = threadIdx.x * words_per_thread + j;
      bits[j] = w < word_count ? chunk_words[w] : 0u;
      set += __popc(bits[j]);
    }
    std::uint32_t before = 0;
    scan_t(scan).ExclusiveSum(set, before);
#pragma unroll
    for (int j = 0; j < words_per_thread; ++j) {
      const std::uint32_t w = threadIdx.x * words_per_thread + j;
      if (w < word_count) {
        word_bits[w] = bits[j];
        word_first[w] = before;
      }
      before += __popc(bits[j]);
    }
    __syncthreads();
    const T* chunk_values = values + layout.values_begin(chunk);
    Out* chunk_out = out + layout.chunk_begin(chunk);
    const float scale = layout.value_scale(chunk);
    using store_t = sixteen_bytes_of<Out>;
    constexpr int per_store = 16 / sizeof(Out);  // divides 32: a store's elements share a word
    const bool aligned = reinterpret_cast<std::uintptr_t>(chunk_out) % sizeof(store_t) == 0;
    for (std::uint32_t e = threadIdx.x * per_store; e < length; e += block_threads * per_store) {
      const std::uint32_t word = word_bits[e / 32], bit = e % 32;
      std::uint32_t slot = word_first[e / 32] + __popc(word & ((1u << bit) - 1u));
      store_t result{};
#pragma unroll
      for (int j = 0; j < per_store; ++j)
        if ((word >> (bit + j)) & 1u)
          result.item[j] = densified<Out>(chunk_values[slot++], layout.rescale, scale);
      if (aligned && e + per_store <= length) {
        *reinterpret_cast<store_t*>(chunk_out + e) = result;
      } else {
        for (std::uint32_t j = 0; j < per_store && e + j < length; ++j)
          chunk_out[e + j] = result.item[j];
      }
    }
    __syncthreads();  // before the words of the next chunk are written
  }
}

/// Zeroes `length` elements at `out` with 16-byte stores (scalar ones before the first 16-byte
/// boundary and after the last). Called by every thread of the block.
template <class Out>
__device__ void zero_span(Out* out, std::uint32_t length) {
  using store_t = sixteen_bytes_of<Out>;
  constexpr int per_store = 16 / sizeof(Out);
  const auto misaligned = static_cast<std::uint32_t>(
      (sizeof(store_t) - reinterpret_cast<std::uintptr_t>(out) % sizeof(store_t)) %
      sizeof(store_t) / sizeof(Out));
  const std::uint32_t head = misaligned < length ? misaligned : length;
  const std::uint32_t vectors = (length - head) / per_store;
  for (std::uint32_t i = threadIdx.x; i < head; i += block_threads) out[i] = Out{};
  for (std::uint32_t v = threadIdx.x; v < vectors; v += block_threads)
    reinterpret_cast<store_t*>(out + head)[v] = store_t{};
  for (std::uint32_t i = head + vectors * per_store + threadIdx.x; i < length; i += block_threads)
    out[i] = Out{};
}

/// Writes every element of a cache with 16-bit offsets (chunks of at most 2^16) in one launch:
/// one block per chunk zeroes the chunk's span with 16-byte stores, then writes the chunk's kept
/// values at their offsets. Zeros and values meet in L2, so DRAM takes about one write of each
/// output byte, where a memset and then a scatter kernel write the sectors holding a kept value a
/// second time once a large output has left L2 (a third more bytes at gamma 0.95 in float32, by
/// the model of docs/gpu-kernels.md).
template <class T, class Out>
DROPIT_KERNEL void chunk_scatter_offsets_kernel(cache_layout layout, const T* values,
                                                const std::uint16_t* offsets, Out* out) {
  const std::int64_t chunks = layout.chunk_count();
  for (std::int64_t chunk = blockIdx.x; chunk < chunks; chunk += gridDim.x) {
    Out* chunk_out = out + layout.chunk_begin(chunk);
    zero_span(chunk_out, static_cast<std::uint32_t>(layout.chunk_length(chunk)));
    __syncthreads();  // the zeros before the values written over them
    const std::int64_t first = layout.values_begin(chunk);
    const auto kept = static_cast<std::uint32_t>(layout.kept_in_chunk(chunk));
    const float scale = layout.value_scale(chunk);
    for (std::uint32_t j = threadIdx.x; j < kept; j += block_threads)
      chunk_out[offsets[first + j]] = densified<Out>(values[first + j], layout.rescale, scale);
  }
}

/// Elements of the output a block of tile_scatter_offsets_kernel writes.
inline constexpr std::int64_t offsets_tile = std::int64_t{1} << 14;

/// How many of the ascending `offsets[0 .. count)` lie below `target`, searched by the block: each
/// round every thread probes the first offset of its share of the range left (a 256th), and the
/// probes below the target, a prefix of them, narrow it to one share: at most 4 rounds. `count`
/// below 2^31 (a cache takes 32-bit offsets where it keeps under n/32 < 2^27 values). Called by
/// every thread of the block; `probes_below`: one word per warp of shared memory.
__device__ inline std::uint32_t offsets_below(const std::uint32_t* offsets, std::uint32_t count,
                                              std::uint32_t target, std::uint32_t* probes_below) {
  std::uint32_t first = 0, left = count;  // the answer lies in [first, first + left]
  while (left > 0) {                      // uniform in the block
    const std::uint32_t share = (left + block_threads - 1) / block_threads;
    const std::uint32_t probe = threadIdx.x * share;
    const bool below = probe < left && offsets[first + probe] < target;
    const unsigned ballot = __ballot_sync(0xffffffffu, below);
    if ((threadIdx.x & 31u) == 0) probes_below[threadIdx.x / 32] = __popc(ballot);
    __syncthreads();
    std::uint32_t below_count = 0;
    for (int w = 0; w < block_warps; ++w) below_count += probes_below[w];
    __syncthreads();              // before the counts are written again
    if (below_count == 0) break;  // offsets[first] is at or above the target
    // The last probe below lies at (below_count - 1) * share: the answer follows it, at most up to
    // the next probe (or the range's end).
    const std::uint32_t next = below_count * share < left ? below_count * share : left;
    first += (below_count - 1) * share + 1;
    left = next - ((below_count - 1) * share + 1);
  }
  return first;
}

/// Writes every element of a cache with 32-bit offsets (min-k over a whole tensor: one chunk, its
/// offsets ascending as compress writes them) in one launch: a block per tile of `offsets_tile`
/// elements finds the kept values whose offsets fall in its tile (offsets_below, twice), zeroes the
/// tile with 16-byte stores, then writes those values. As in chunk_scatter_offsets_kernel, zeros
/// and values meet in L2, where a memset of the whole output and a scatter wrote the sectors
/// holding a kept value twice.
template <class T, class Out>
DROPIT_KERNEL void tile_scatter_offsets_kernel(cache_layout layout, const T* values,
                                               const std::uint32_t* offsets, Out* out) {
  __shared__ std::uint32_t probes_below[block_warps];
  const std::int64_t n = layout.numel();  // under 2^32: offsets are 32-bit
  const auto kept = static_cast<std::uint32_t>(layout.kept_per_chunk);
  const float scale = layout.value_scale(0);
  for (std::int64_t begin = blockIdx.x * offsets_tile; begin < n;
       begin += std::int64_t{gridDim.x} * offsets_tile) {
    const auto tile_begin = static_cast<std::uint32_t>(begin);
    const auto length =
        static_cast<std::uint32_t>(n - begin < offsets_tile ? n - begin : offsets_tile);
    const std::uint32_t first = offsets_below(offsets, kept, tile_begin, probes_below);
    const std::uint32_t last =  // searched after `first` only
        first + offsets_below(offsets + first, kept - first, tile_begin + length, probes_below);
    zero_span(out + begin, length);
    __syncthreads();  // the zeros before the values written over them
    for (std::uint32_t j = first + threadIdx.x; j < last; j += block_threads)
      out[offsets[j]] = densified<Out>(values[j], layout.rescale, scale);
  }
}

// ---------------------------------------------------------------------------------------------
// Channels.

/// Sum of squares of each run of `channel_score_block` consecutive elements of each channel (in
/// [outer, inner] order), summed sequentially in double: run_sums[c * runs + r]. Grid-stride.
template <class T>
__device__ void channel_run_sums(const cache_layout& layout, const T* input, std::int64_t runs,
                                 double* run_sums) {
  const std::int64_t per_channel = layout.outer * layout.inner;
  const std::int64_t items = layout.channels * runs;
  const std::int64_t stride = std::int64_t{gridDim.x} * block_threads;
  for (std::int64_t item = std::int64_t{blockIdx.x} * block_threads + threadIdx.x; item < items;
       item += stride) {
    const std::int64_t c = item / runs;
    const std::int64_t begin = item % runs * channel_score_block;
    const std::int64_t end =
        begin + channel_score_block < per_channel ? begin + channel_score_block : per_channel;
    std::int64_t o = begin / layout.inner, r = begin % layout.inner;
    double sum = 0.0;
    for (std::int64_t e = begin; e < end; ++e) {
      const double x = to_float(input[(o * layout.channels + c) * layout.inner + r]);
      sum = __dadd_rn(sum, __dmul_rn(x, x));  // never fused: the CPU backend adds x*x rounded
      if (++r == layout.inner) {
        r = 0;
        ++o;
      }
    }
    run_sums[item] = sum;
  }
}

template <class T>
DROPIT_KERNEL void channel_run_sums_kernel(cache_layout layout, const T* input, std::int64_t runs,
                                           double* run_sums) {
  channel_run_sums(layout, input, runs, run_sums);
}

/// Channel `c`'s run sums added in order, as a key ordered like channel_ranks_before: scores are
/// >= +0, +inf or NaN, whose bits ascend with the score, and every NaN is clamped to one key above
/// infinity.
__device__ inline std::uint64_t channel_key(const double* run_sums, std::int64_t runs,
                                            std::int64_t c) {
  double total = 0.0;
  for (std::int64_t r = 0; r < runs; ++r) total = __dadd_rn(total, run_sums[c * runs + r]);
  return total != total ? 0x7ff0000000000001ull
                        : static_cast<std::uint64_t>(__double_as_longlong(total));
}

template <class = void>
DROPIT_KERNEL void channel_keys_kernel(const double* run_sums, std::int64_t runs,
                                       std::int64_t channels, std::uint64_t* keys) {
  const std::int64_t stride = std::int64_t{gridDim.x} * block_threads;
  for (std::int64_t c = std::int64_t{blockIdx.x} * block_threads + threadIdx.x; c < channels;
       c += stride)
    keys[c] = channel_key(run_sums, runs, c);
}

/// values[(o * kept + j) * inner + r] = input[(o * channels + list[j]) * inner + r]. Grid-stride.
template <class T>
__device__ void channel_gather(const cache_layout& layout, const T* input,
                               const std::uint32_t* list, T* values) {
  const std::int64_t count = layout.outer * layout.kept_channels * layout.inner;
  const std::int64_t stride = std::int64_t{gridDim.x} * block_threads;
  const std::int64_t start = std::int64_t{blockIdx.x} * block_threads + threadIdx.x;
  if (start >= count) return;
  index_walk<3> at(start, stride, {layout.kept_channels, layout.inner});
  for (std::int64_t e = start; e < count; e += stride, at.advance())
    values[e] = input[(at[0] * layout.channels + list[at[1]]) * layout.inner + at[2]];
}

template <class T>
DROPIT_KERNEL void channel_gather_kernel(cache_layout layout, const T* input,
                                         const std::uint32_t* list, T* values) {
  channel_gather(layout, input, list, values);
}

/// Channel min-k's compress of at most range_in_block_limit channels in one cooperative launch,
/// grid-wide barriers between its phases: the run sums over every block; the first block's
/// channel keys (written to `keys`) and select_range_in_block over them, writing the ascending
/// list of the kept channels to `list` while the other blocks wait; the gather of the kept
/// channels' values over every block. Any grid is correct; more blocks than the device holds at
/// once cannot be launched.
template <class T>
DROPIT_KERNEL_RESIDENT(5)
void channel_min_k_compress_kernel(cache_layout layout, const T* input, std::int64_t runs,
                                   double* run_sums, std::uint64_t* keys, std::uint32_t* list,
                                   T* values) {
  __shared__ range_in_block_storage storage;
  const cooperative_groups::grid_group grid = cooperative_groups::this_grid();
  channel_run_sums(layout, input, runs, run_sums);
  grid.sync();
  if (blockIdx.x == 0) {
    const auto channels = static_cast<std::uint32_t>(layout.channels);
    for (std::uint32_t c = threadIdx.x; c < channels; c += block_threads)
      keys[c] = channel_key(run_sums, runs, c);
    __syncthreads();  // the block's global writes are seen by the block after it
    select_range_in_block<std::uint64_t, 64>(stored_keys<std::uint64_t>{keys}, channels,
                                             static_cast<std::uint32_t>(layout.kept_channels),
                                             index_writer{list}, storage);
  }
  grid.sync();
  channel_gather(layout, input, list, values);
}

/// slot_of[list[j]] = j (slot_of filled with -1 beforehand).
template <class = void>
DROPIT_KERNEL void channel_map_kernel(const std::uint32_t* list, std::int64_t kept,
                                      std::int32_t* slot_of) {
  const std::int64_t stride = std::int64_t{gridDim.x} * block_threads;
  for (std::int64_t j = std::int64_t{blockIdx.x} * block_threads + threadIdx.x; j < kept;
       j += stride)
    slot_of[list[j]] = static_cast<std::int32_t>(j);
}

/// Channels up to which channel_densify_kernel builds the channel -> slot map in each block's
/// shared memory (32 KiB), from the kept list, in its own launch; beyond, channel_map_kernel builds
/// it in global memory first, after a memset.
inline constexpr std::int64_t channel_map_in_block_limit = std::int64_t{1} << 13;

/// Writes every element of a channel cache's dense tensor: its channel's kept value, or zero. The
/// channel's slot in the kept list comes from `slot_of` (-1: dropped), or with `MapInBlock` from
/// a map the block first builds from `list` (launch at most a few blocks per SM: each builds it).
template <class T, class Out, bool MapInBlock>
DROPIT_KERNEL void channel_densify_kernel(cache_layout layout, const std::uint32_t* list,
                                          const std::int32_t* slot_of, const T* values, Out* out) {
  if constexpr (MapInBlock) {
    __shared__ std::int32_t block_slot_of[channel_map_in_block_limit];
    for (std::int64_t c = threadIdx.x; c < layout.channels; c += block_threads)
      block_slot_of[c] = -1;
    __syncthreads();
    for (std::int64_t j = threadIdx.x; j < layout.kept_channels; j += block_threads)
      block_slot_of[list[j]] = static_cast<std::int32_t>(j);
    __syncthreads();
    slot_of = block_slot_of;
  }
  const std::int64_t count = layout.outer * layout.channels * layout.inner;
  const std::int64_t stride = std::int64_t{gridDim.x} * block_threads;
  const std::int64_t start = std::int64_t{blockIdx.x} * block_threads + threadIdx.x;
  if (start >= count) return;
  const float scale = layout.value_scale(0);  // read once, not per element
  index_walk<3> at(start, stride, {layout.channels, layout.inner});
  for (std::int64_t e = start; e < count; e += stride, at.advance()) {
    const std::int32_t j = slot_of[at[1]];
    out[e] = j < 0
                 ? Out{}
                 : densified<Out>(values[(at[0] * layout.kept_channels + j) * layout.inner + at[2]],
                                  layout.rescale, scale);
  }
}

// ---------------------------------------------------------------------------------------------
// Weight gradients.

inline constexpr int gemm_tile = 16;
static_assert(gemm_tile * gemm_tile == block_threads);

/// dW[o, i] (=, +=) sum_m dZ[m, o] * A[m, i], one 16x16 tile of dW per block iteration.
template <class T>
DROPIT_KERNEL void linear_weight_grad_kernel(const float* a, const T* dz, T* dw, std::int64_t rows,
                                             std::int64_t in_features, std::int64_t out_features,
                                             grad_mode mode) {
  __shared__ float dz_tile[gemm_tile][gemm_tile + 1];  // [m][o]
  __shared__ float a_tile[gemm_tile][gemm_tile + 1];   // [m][i]
  const int tx = static_cast<int>(threadIdx.x) % gemm_tile;
  const int ty = static_cast<int>(threadIdx.x) / gemm_tile;
  const std::int64_t tiles_i = (in_features + gemm_tile - 1) / gemm_tile;
  const std::int64_t tiles = tiles_i * ((out_features + gemm_tile - 1) / gemm_tile);
  for (std::int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    const std::int64_t i0 = t % tiles_i * gemm_tile, o0 = t / tiles_i * gemm_tile;
    float sum = 0.0f;
    for (std::int64_t m0 = 0; m0 < rows; m0 += gemm_tile) {
      const std::int64_t m = m0 + ty;
      dz_tile[ty][tx] =
          m < rows && o0 + tx < out_features ? to_float(dz[m * out_features + o0 + tx]) : 0.0f;
      a_tile[ty][tx] = m < rows && i0 + tx < in_features ? a[m * in_features + i0 + tx] : 0.0f;
      __syncthreads();
      for (int mm = 0; mm < gemm_tile; ++mm) sum += dz_tile[mm][ty] * a_tile[mm][tx];
      __syncthreads();
    }
    const std::int64_t o = o0 + ty, i = i0 + tx;
    if (o < out_features && i < in_features) store_gradient(dw[o * in_features + i], sum, mode);
  }
}

/// dW[co, ci, kh, kw] (=, +=) sum over (n, oh, ow) of dZ[n, co, oh, ow] * X[n, cin, ih, iw], one
/// dW element per block iteration; X is the densified float input. The threads walk the terms
/// (n, oh, ow) without dividing per term.
template <class T>
DROPIT_KERNEL void conv2d_weight_grad_kernel(conv2d_geometry g, const float* x, const T* dz, T* dw,
                                             grad_mode mode) {
  using reduce_t = cub::BlockReduce<float, block_threads>;
  __shared__ typename reduce_t::TempStorage reduce;
  const std::int64_t group_in = g.in_channels / g.groups, group_out = g.out_channels / g.groups;
  const std::int64_t taps = g.kernel_h * g.kernel_w;
  const std::int64_t outputs = g.out_channels * group_in * taps;
  const std::int64_t pixels = g.out_height * g.out_width;
  const std::int64_t terms = g.batch * pixels;
  const index_walk<3> first_term(threadIdx.x, block_threads, {g.out_height, g.out_width});
  for (std::int64_t w = blockIdx.x; w < outputs; w += gridDim.x) {
    const std::int64_t tap = w % taps, ci = w / taps % group_in, co = w / (taps * group_in);
    const std::int64_t kh = tap / g.kernel_w, kw = tap % g.kernel_w;
    const std::int64_t channel = co / group_out * group_in + ci;
    float sum = 0.0f;
    index_walk<3> at = first_term;  // (n, oh, ow)
    for (std::int64_t term = threadIdx.x; term < terms; term += block_threads, at.advance()) {
      const std::int64_t ih = at[1] * g.stride_h - g.pad_h + kh * g.dilation_h;
      const std::int64_t iw = at[2] * g.stride_w - g.pad_w + kw * g.dilation_w;
      if (ih < 0 || ih >= g.height || iw < 0 || iw >= g.width) continue;
      sum += to_float(
                 dz[((at[0] * g.out_channels + co) * g.out_height + at[1]) * g.out_width + at[2]]) *
             x[((at[0] * g.in_channels + channel) * g.height + ih) * g.width + iw];
    }
    const float total = reduce_t(reduce).Sum(sum);
    if (threadIdx.x == 0) store_gradient(dw[w], total, mode);
    __syncthreads();  // before the reduction storage is reused
  }
}

/// The im2col block of samples [first, first + samples) of the dense input `x`: row
/// (c * KH + kh) * KW + kw, column s * P + p (P = H_out * W_out, p = oh * W_out + ow) holds the
/// input element that tap (kh, kw) of output pixel p of sample first + s reads in channel c, or
/// zero in the padding. Each thread walks the six coordinates of its elements without dividing.
template <class T>
DROPIT_KERNEL void conv2d_columns_kernel(conv2d_geometry g, const T* x, std::int64_t first,
                                         std::int64_t samples, T* columns) {
  const std::int64_t total =
      g.in_channels * g.kernel_h * g.kernel_w * samples * g.out_height * g.out_width;
  const std::int64_t stride = std::int64_t{gridDim.x} * block_threads;
  const std::int64_t start = std::int64_t{blockIdx.x} * block_threads + threadIdx.x;
  if (start >= total) return;
  // (c, kh, kw, s, oh, ow)
  index_walk<6> at(start, stride, {g.kernel_h, g.kernel_w, samples, g.out_height, g.out_width});
  for (std::int64_t i = start; i < total; i += stride, at.advance()) {
    const std::int64_t ih = at[4] * g.stride_h - g.pad_h + at[1] * g.dilation_h;
    const std::int64_t iw = at[5] * g.stride_w - g.pad_w + at[2] * g.dilation_w;
    const bool inside = ih >= 0 && ih < g.height && iw >= 0 && iw < g.width;
    columns[i] = inside
                     ? x[(((first + at[3]) * g.in_channels + at[0]) * g.height + ih) * g.width + iw]
                     : T{};
  }
}

/// dZ of samples [first, first + samples) as rows per output channel: row co, column s * P + p.
template <class T>
DROPIT_KERNEL void conv2d_dz_rows_kernel(conv2d_geometry g, const T* dz, std::int64_t first,
                                         std::int64_t samples, T* rows) {
  const std::int64_t pixels = g.out_height * g.out_width;
  const std::int64_t total = g.out_channels * samples * pixels;
  const std::int64_t stride = std::int64_t{gridDim.x} * block_threads;
  const std::int64_t start = std::int64_t{blockIdx.x} * block_threads + threadIdx.x;
  if (start >= total) return;
  index_walk<3> at(start, stride, {samples, pixels});  // (co, s, p)
  for (std::int64_t i = start; i < total; i += stride, at.advance())
    rows[i] = dz[((first + at[1]) * g.out_channels + at[0]) * pixels + at[2]];
}

/// `out` (=, +=) the float gradient `sum`, rounded once.
template <class T>
DROPIT_KERNEL void store_gradient_kernel(const float* sum, T* out, std::int64_t n, grad_mode mode) {
  const std::int64_t stride = std::int64_t{gridDim.x} * block_threads;
  for (std::int64_t i = std::int64_t{blockIdx.x} * block_threads + threadIdx.x; i < n; i += stride)
    store_gradient(out[i], sum[i], mode);
}

// ---------------------------------------------------------------------------------------------
// ReLU masks.

// Both kernels walk warp tiles of 32·V consecutive elements, V per lane: one 16-byte vector
// (V = 16 / sizeof(T)) where every pointer is 16-byte aligned, else one element (V = 1). A lane's
// V keep bits are consecutive in the tile's mask words, so a word is the OR of 32 / V lanes' bits.
// Where V = 1, and in a tile that the tensor's end cuts short, a word is one ballot. Bytes:
// the pack reads n·s and writes n·s (unless y is null) + n/8, the apply reads n·s + n/8 and writes
// n·s, each element once, in one launch; 16-byte loads keep 32 KiB per SM in flight, enough for
// the copy rate's latency.

/// Elements of T in one 16-byte load.
template <class T>
inline constexpr int vector_items = 16 / static_cast<int>(sizeof(T));

/// V consecutive elements loaded or stored at once (the address a multiple of V elements).
template <class T, int V>
struct alignas(V * sizeof(T)) item_vector {
  T item[V];
};

/// The warp tiles of `n` elements and this warp's first one, and the grid's warp count.
struct warp_tiles {
  std::int64_t count, first, stride;
  __device__ warp_tiles(std::int64_t n, int tile_items)
      : count((n + tile_items - 1) / tile_items),
        first((std::int64_t{blockIdx.x} * block_threads + threadIdx.x) / 32),
        stride(std::int64_t{gridDim.x} * (block_threads / 32)) {}
};

/// The mask of `x` into `words`, and `relu(x)` into `y` unless `y` is null (`y` may be `x`).
template <class T, int V>
DROPIT_KERNEL void pack_relu_mask_kernel(const T* x, T* y, std::int64_t n, std::uint32_t* words) {
  constexpr int tile_items = 32 * V, lanes_per_word = 32 / V;
  const int lane = static_cast<int>(threadIdx.x & 31u);
  const warp_tiles tiles(n, tile_items);
  for (std::int64_t tile = tiles.first; tile < tiles.count; tile += tiles.stride) {
    // The tile's own pointers and 32-bit offsets within it.
    const T* tile_x = x + tile * tile_items;
    T* tile_y = y == nullptr ? nullptr : y + tile * tile_items;
    std::uint32_t* tile_words = words + tile * V;
    const int items = static_cast<int>(min(n - tile * tile_items, std::int64_t{tile_items}));
    if constexpr (V > 1) {
      if (items == tile_items) {
        auto values = *reinterpret_cast<const item_vector<T, V>*>(tile_x + lane * V);
        std::uint32_t bits = 0;
        for (int k = 0; k < V; ++k) {
          const bool passes = relu_passes(values.item[k]);
          bits |= static_cast<std::uint32_t>(passes) << k;
          if (!passes) values.item[k] = T{};
        }
        if (tile_y != nullptr) *reinterpret_cast<item_vector<T, V>*>(tile_y + lane * V) = values;
        bits <<= V * (lane % lanes_per_word);
        for (int offset = 1; offset < lanes_per_word; offset *= 2)
          bits |= __shfl_xor_sync(0xffffffffu, bits, offset);
        if (lane % lanes_per_word == 0) tile_words[lane / lanes_per_word] = bits;
        continue;
      }
    }
    // Element by element (V = 1, or the last tile, cut short): 32 per round, one ballot a word.
    for (int first = 0; first < items; first += 32) {
      const int i = first + lane;
      const T value = i < items ? tile_x[i] : T{};
      const bool passes = i < items && relu_passes(value);
      const std::uint32_t bits = __ballot_sync(0xffffffffu, passes);
      if (lane == 0) tile_words[first / 32] = bits;
      if (tile_y != nullptr && i < items) tile_y[i] = passes ? value : T{};
    }
  }
}

template <class T, int V>
DROPIT_KERNEL void apply_relu_mask_kernel(const std::uint32_t* words, const T* dy, T* dx,
                                          std::int64_t n) {
  constexpr int tile_items = 32 * V;
  const int lane = static_cast<int>(threadIdx.x & 31u);
  const warp_tiles tiles(n, tile_items);
  for (std::int64_t tile = tiles.first; tile < tiles.count; tile += tiles.stride) {
    const T* tile_dy = dy + tile * tile_items;
    T* tile_dx = dx + tile * tile_items;
    const std::uint32_t* tile_words = words + tile * V;
    const int items = static_cast<int>(min(n - tile * tile_items, std::int64_t{tile_items}));
    if constexpr (V > 1) {
      if (items == tile_items) {
        const int first = lane * V;
        const std::uint32_t bits = tile_words[first / 32] >> (first % 32);
        auto values = *reinterpret_cast<const item_vector<T, V>*>(tile_dy + first);
        for (int k = 0; k < V; ++k)
          if (((bits >> k) & 1u) == 0) values.item[k] = T{};
        *reinterpret_cast<item_vector<T, V>*>(tile_dx + first) = values;
        continue;
      }
    }
    for (int first = 0; first < items; first += 32) {
      const std::uint32_t word = tile_words[first / 32];
      const int i = first + lane;
      if (i < items) tile_dx[i] = (word >> lane) & 1u ? tile_dy[i] : T{};
    }
  }
}

/// Sets mask bits [position, position + length) to the low `length` bits of `bits` (length 1 to
/// 32). A whole aligned word belongs to the caller; the bits of a word cut short are shared with
/// another tile, so they are cleared and set atomically (each bit has one writer).
__device__ inline void store_mask_bits(std::uint32_t* words, std::int64_t position,
                                       std::uint32_t bits, int length) {
  const int shift = static_cast<int>(position % 32);
  const std::int64_t word = position / 32;
  if (shift == 0 && length == 32) {
    words[word] = bits;
    return;
  }
  const std::uint64_t field = low_bits(length) << shift;
  const std::uint64_t value = (static_cast<std::uint64_t>(bits) << shift) & field;
  for (int k = 0; k < 2; ++k) {
    const auto word_field = static_cast<std::uint32_t>(field >> (32 * k));
    if (word_field == 0) continue;
    atomicAnd(words + word + k, ~word_field);
    atomicOr(words + word + k, static_cast<std::uint32_t>(value >> (32 * k)));
  }
}

/// One tile of a channels-last tensor: its first channel and pixel, its image, and how many of its
/// 32 pixels and 32 channels the tensor has.
struct channels_last_tile {
  std::int64_t first_channel, first_pixel, image;
  int pixels, channels;
};

/// The tiles of 32 pixels by 32 channels of a channels-last tensor, a block's at a time.
struct channels_last_tiles {
  channels_last_dims dims;
  std::int64_t pixel_tiles, channel_tiles, count;

  DROPIT_HOST_DEVICE explicit channels_last_tiles(const channels_last_dims& d)
      : dims(d),
        pixel_tiles((d.pixels + 31) / 32),
        channel_tiles((d.channels + 31) / 32),
        count(d.images * pixel_tiles * channel_tiles) {}

  __device__ channels_last_tile operator[](std::int64_t tile) const {
    channels_last_tile t;
    t.first_channel = tile % channel_tiles * 32;
    t.first_pixel = tile / channel_tiles % pixel_tiles * 32;
    t.image = tile / (channel_tiles * pixel_tiles);
    t.pixels = static_cast<int>(min(dims.pixels - t.first_pixel, std::int64_t{32}));
    t.channels = static_cast<int>(min(dims.channels - t.first_channel, std::int64_t{32}));
    return t;
  }
};

/// The logical order of a channels-last tensor: a block reads a tile of 32 pixel rows by 32
/// channels (a row's channels adjacent in memory) into shared memory and writes it transposed,
/// each channel's 32 pixels adjacent. `Bits` is an unsigned type of the elements' size: a copy.
template <class Bits>
DROPIT_KERNEL void transpose_channels_last_kernel(const Bits* input, Bits* out,
                                                  channels_last_dims d) {
  constexpr int warps = block_threads / 32;
  __shared__ Bits tile_elements[32][33];
  const int lane = static_cast<int>(threadIdx.x & 31u), warp = static_cast<int>(threadIdx.x / 32);
  const channels_last_tiles tiles(d);
  for (std::int64_t tile = blockIdx.x; tile < tiles.count; tile += gridDim.x) {
    const auto [c0, p0, image, pixels, channels] = tiles[tile];
    for (int row = warp; row < pixels; row += warps)
      if (lane < channels)
        tile_elements[row][lane] = input[(image * d.pixels + p0 + row) * d.channels + c0 + lane];
    __syncthreads();
    for (int column = warp; column < channels; column += warps)
      if (lane < pixels)
        out[(image * d.channels + c0 + column) * d.pixels + p0 + lane] =
            tile_elements[lane][column];
    __syncthreads();
  }
}

/// A channels-last `relu(x)` into `y` (unless null; `y` may be `x`) and its mask in logical order:
/// a block reads a tile of 32 pixel rows by 32 channels and transposes its pass bits through
/// shared memory, so that one ballot gives a channel's 32 pixels.
template <class T>
DROPIT_KERNEL void pack_relu_mask_channels_last_kernel(const T* x, T* y, channels_last_dims d,
                                                       std::uint32_t* words) {
  constexpr int warps = block_threads / 32;
  __shared__ std::uint8_t passes[32][33];
  const int lane = static_cast<int>(threadIdx.x & 31u), warp = static_cast<int>(threadIdx.x / 32);
  const channels_last_tiles tiles(d);
  for (std::int64_t tile = blockIdx.x; tile < tiles.count; tile += gridDim.x) {
    const auto [c0, p0, image, pixels, channels] = tiles[tile];
    for (int row = warp; row < 32; row += warps) {
      bool pass = false;
      if (row < pixels && lane < channels) {
        const std::int64_t i = (image * d.pixels + p0 + row) * d.channels + c0 + lane;
        const T value = x[i];
        pass = relu_passes(value);
        if (y != nullptr) y[i] = pass ? value : T{};
      }
      passes[row][lane] = pass;
    }
    __syncthreads();
    for (int column = warp; column < channels; column += warps) {
      const std::uint32_t bits = __ballot_sync(0xffffffffu, passes[lane][column] != 0);
      if (lane != 0) continue;
      const std::int64_t position = (image * d.channels + c0 + column) * d.pixels + p0;
      store_mask_bits(words, position, bits, pixels);
      // The tensor's last bits: the rest of their word is cleared, as the flat kernels leave it.
      const std::int64_t end = position + pixels;
      if (end == d.images * d.channels * d.pixels && end % 32 != 0)
        store_mask_bits(words, end, 0u, static_cast<int>(32 - end % 32));
    }
    __syncthreads();
  }
}

/// `dx = mask ? dy : 0` of a channels-last gradient with the mask in logical order: in a tile of
/// 32 pixels by 32 channels, each lane loads its channel's 32 bits and walks the pixel rows.
template <class T>
DROPIT_KERNEL void apply_relu_mask_channels_last_kernel(const std::uint32_t* words, const T* dy,
                                                        T* dx, channels_last_dims d) {
  constexpr int warps = block_threads / 32;
  const int lane = static_cast<int>(threadIdx.x & 31u), warp = static_cast<int>(threadIdx.x / 32);
  const channels_last_tiles tiles(d);
  for (std::int64_t tile = blockIdx.x; tile < tiles.count; tile += gridDim.x) {
    const auto [c0, p0, image, pixels, channels] = tiles[tile];
    if (lane >= channels) continue;
    const std::uint32_t bits =
        load_mask_bits(words, (image * d.channels + c0 + lane) * d.pixels + p0, pixels);
    for (int row = warp; row < pixels; row += warps) {
      const std::int64_t i = (image * d.pixels + p0 + row) * d.channels + c0 + lane;
      dx[i] = (bits >> row) & 1u ? dy[i] : T{};
    }
  }
}

}  // namespace dropit::detail::cuda
