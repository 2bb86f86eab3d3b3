#pragma once
// CUDA compress and densify: host code that validates nothing (the entry points did), carves the
// caller's workspace and enqueues kernels on the caller's stream. Nothing here allocates or
// synchronises.
//
// Which selection runs where:
// - chunked min-k and random (element): one block per chunk (select_chunks_kernel). The chunk is
//   read from global memory once into shared memory (its values, or its generator draws), where
//   the radix passes (three of 11 bits, two for 16-bit types), the emit and the writers read it.
//   Chunks too long for the device's shared memory recompute their keys from global memory (L2
//   after the first pass) in every pass.
// - min-k over the whole tensor, and channel selection: select_global below, over magnitude keys,
//   generator draws or channel-score keys, in one launch: a radix pass per 12 bits of key (two
//   for 16-bit magnitudes, three for float and draws, six for 64-bit channel scores), reading
//   every key until a pass has collected the bin holding the cut, then one emit with look-back;
//   beyond one block's range, the blocks of one cooperative launch wait for one another between
//   these phases.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <optional>
#include <type_traits>

#include "../../cache.hpp"
#include "../../policy.hpp"
#include "../common/keys.hpp"
#include "common.cuh"
#include "kernels.cuh"
#include "lookback.cuh"
#include "select.cuh"

namespace dropit::detail::cuda {

// ---------------------------------------------------------------------------------------------
// What the runtime says of a kernel on a device, asked once.

/// Whether `Kernel` can be launched with `bytes` of dynamic shared memory on the current device.
/// Its attribute is raised to the device's limit once and never lowered, so that a launch on one
/// host thread cannot invalidate another thread's launch of a larger size. (`Kernel` is a template
/// argument: kernels of one signature share a function type, not their attributes.)
template <auto Kernel>
bool reserve_dynamic_shared_memory(std::size_t bytes, const char* name) {
  const auto raise_limit = [name](int device) {
    int available = 0;
    check(cudaDeviceGetAttribute(&available, cudaDevAttrMaxSharedMemoryPerBlockOptin, device),
          name);
    cudaFuncAttributes attributes{};
    check(cudaFuncGetAttributes(&attributes, Kernel), name);
    const std::size_t limit = static_cast<std::size_t>(available) > attributes.sharedSizeBytes
                                  ? static_cast<std::size_t>(available) - attributes.sharedSizeBytes
                                  : 0;
    check(cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               static_cast<int>(limit)),
          name);
    return limit;
  };
  return bytes <= once_per_device(raise_limit, name);
}

/// The most blocks of `Kernel` (`block_threads` threads, no dynamic shared memory) the current
/// device holds at once: the largest grid a cooperative launch of it may have. Throws where the
/// device launches no cooperative kernel.
template <auto Kernel>
unsigned resident_blocks(const char* name) {
  const auto count = [name](int device) {
    int cooperative = 0, per_multiprocessor = 0, multiprocessors = 0;
    check(cudaDeviceGetAttribute(&cooperative, cudaDevAttrCooperativeLaunch, device), name);
    expect(cooperative != 0, name, ": CUDA device ", device,
           " cannot launch cooperative kernels, which selections over a whole tensor or over its "
           "channels need; chunked selections (the default) run there");
    check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_multiprocessor, Kernel, block_threads,
                                                        0),
          name);
    check(cudaDeviceGetAttribute(&multiprocessors, cudaDevAttrMultiProcessorCount, device), name);
    expect(per_multiprocessor > 0, name, ": no block of ", block_threads,
           " threads fits a multiprocessor of CUDA device ", device);
    return static_cast<std::size_t>(per_multiprocessor) * static_cast<std::size_t>(multiprocessors);
  };
  return static_cast<unsigned>(once_per_device(count, name));
}

/// Launches `kernel` on `grid` blocks (at most resident_blocks) of `block_threads` threads, all
/// resident at once, so that its blocks may wait for one another (a grid-wide barrier). The
/// runtime copies each parameter from `args`, converted to the kernel's parameter types here.
template <class... Params>
void launch_cooperative(void (*kernel)(Params...), cudaStream_t stream, unsigned grid,
                        const char* name, std::type_identity_t<Params>... args) {
#if defined(DROPIT_CUDA_EMULATION)
  static_cast<void>(stream);
  check(::dropit_emulation::run_grid(
            dim3(grid), dim3(block_threads), 0, [&] { kernel(args...); }, true),
        name);
#else
  void* pointers[] = {static_cast<void*>(&args)...};
  check(cudaLaunchCooperativeKernel(kernel, dim3(grid), dim3(block_threads), pointers, 0, stream),
        name);
#endif
}

// ---------------------------------------------------------------------------------------------
// Selection over many blocks.

struct global_select_scratch {
  void* state = nullptr;            // a range_state<Key>
  std::uint32_t* zeroed = nullptr;  // the passes' histogram and counters, then the emit's words,
                                    // cleared by the selection's kernel first
  std::size_t zeroed_words = 0;
  void* candidates = nullptr;  // `capacity` keys
  std::uint32_t capacity = 0;
  lookback_tiles spans;  // the emit's
};

/// The scratch of select_global<Key, KeyBits> over `m` candidates (none for a range one block
/// selects). Where a pass follows the second (keys of more than 24 bits), the second may set aside
/// the keys of the bin it starts from for the passes after it: room for a sixteenth of the
/// candidates.
template <class Key, int KeyBits>
global_select_scratch add_global_select(workspace_carver& carver, std::int64_t m) {
  global_select_scratch s;
  if (m <= range_in_block_limit) return s;
  const std::int64_t spans = (m + span_size - 1) / span_size;
  s.state = carver.add<range_state<Key>>(1);
  s.zeroed_words = range_bins + 2 + lookback_tiles::zeroed_words(spans);
  s.zeroed = carver.add<std::uint32_t>(s.zeroed_words);
  s.spans = add_lookback_tiles(carver, spans, s.zeroed + range_bins + 2);
  s.capacity = range_digits<Key, KeyBits>::passes >= 3 ? static_cast<std::uint32_t>(m / 16) : 0u;
  s.candidates = carver.add<Key>(std::size_t{s.capacity});
  return s;
}

/// Keeps the `k` largest of the `m` keys `key_of(0 .. m-1)` (m < 2^32; ties to the lower index),
/// whose low bits below the top `KeyBits` are zero, and calls `visit` (see emit_selected) on them
/// in index order, with their slots 0 .. k-1. One launch: up to range_in_block_limit keys, one
/// block; beyond, select_range_kernel, whose blocks run every pass (one per 12 bits of key: two
/// for 16-bit magnitudes, three for float) and the emit with grid-wide barriers between them. The
/// candidates are read once per pass until a pass has collected the bin holding the cut, and once
/// by the emit: three times for float magnitudes whose bin fits the candidate buffer (it took six
/// reads in 12 launches, then three in a memset and 4 launches). `max_blocks` caps the grid (the
/// tests take fewer blocks than spans).
template <class Key, int KeyBits, class KeyOf, class Visit>
void select_global(cudaStream_t stream, const KeyOf& key_of, std::int64_t m, std::int64_t k,
                   const global_select_scratch& scratch, const Visit& visit,
                   unsigned max_blocks = std::numeric_limits<unsigned>::max()) {
  if (m <= 0) return;
  const auto m32 = static_cast<std::uint32_t>(m);
  const auto k32 = static_cast<std::uint32_t>(std::min(k, m));
  if (m <= range_in_block_limit) {
    launch(select_range_in_block_kernel<Key, KeyBits, KeyOf, Visit>, {1}, stream, key_of, m32, k32,
           visit);
    check_launch("dropit select_range_in_block_kernel");
    return;
  }
  constexpr auto kernel = select_range_kernel<Key, KeyBits, KeyOf, Visit>;
  constexpr const char* name = "dropit select_range_kernel";
  const range_select_scratch<Key> passes{static_cast<range_state<Key>*>(scratch.state),
                                         scratch.zeroed, scratch.zeroed + range_bins,
                                         static_cast<Key*>(scratch.candidates), scratch.capacity};
  // A block per span of the emit, which is 16 of a pass's 1024-key iterations (its histogram's
  // clearing and folding, 4096 bins, stay small next to its counting), as many as fit at once.
  const unsigned grid =
      std::min({grid_for(m, span_size), resident_blocks<kernel>(name), max_blocks});
  launch_cooperative(kernel, stream, grid, name, key_of, m32, k32, passes, scratch.zeroed,
                     static_cast<std::uint32_t>(scratch.zeroed_words), scratch.spans, visit);
}

// ---------------------------------------------------------------------------------------------
// compress

struct compress_scratch {
  global_select_scratch select;           // min-k over the tensor, or over the channels
  double* run_sums = nullptr;             // channel min-k: [channels][runs]
  std::int64_t runs = 0;                  // runs of channel_score_block per channel
  std::uint64_t* channel_keys = nullptr;  // channel min-k
  std::uint32_t* channel_list = nullptr;  // seeded channel caches (not stored in the cache)
  void* logical_input = nullptr;          // an input stored channels-last, in logical order
};

/// Whether the layout's selection picks from the whole tensor at once (many blocks) rather than
/// chunk by chunk (a block per chunk).
inline bool whole_tensor_selection(const cache_layout& layout) {
  return visit_selection(layout.selection, []<class S>(std::type_identity<S>) {
    return selection_traits<S>::whole_tensor;
  });
}

/// The scratch of compress; `channels_last` is set where the input is stored so.
template <storage_type T>
compress_scratch add_compress_scratch(workspace_carver& carver, const cache_layout& layout,
                                      const std::optional<channels_last_dims>& channels_last) {
  compress_scratch s;
  if (channels_last) s.logical_input = carver.add<T>(layout.numel());
  if (layout.channel_granularity) {
    if (layout.stores_positions()) {  // channels ranked by score
      s.runs = (layout.outer * layout.inner + channel_score_block - 1) / channel_score_block;
      s.run_sums = carver.add<double>(static_cast<std::size_t>(layout.channels * s.runs));
      s.channel_keys = carver.add<std::uint64_t>(static_cast<std::size_t>(layout.channels));
      s.select = add_global_select<std::uint64_t, 64>(carver, layout.channels);
    } else {  // channels drawn
      s.select = add_global_select<std::uint32_t, 32>(carver, layout.channels);
    }
    if (layout.encoding == position_encoding::seeded)
      s.channel_list = carver.add<std::uint32_t>(static_cast<std::size_t>(layout.kept_channels));
  } else if (whole_tensor_selection(layout)) {
    s.select = add_global_select<std::uint32_t, magnitude_key_bits<T>>(carver, layout.numel());
  }
  return s;
}

/// One block per chunk, with the chunk staged in shared memory where the device has room for it
/// (D = 2^14 needs 64 KiB in float32, 32 KiB in 16-bit types; sm_80 and sm_90 have room for
/// 2^15 float32 or 2^16 16-bit values), else re-reading it.
template <class Selection, class T, class Writer>
void launch_select_chunks(cudaStream_t stream, const cache_layout& layout, const T* input,
                          const Writer& writer) {
  const unsigned grid = grid_for(layout.chunk_count(), 1);
  // Whole 16-byte vectors, as the kernel stages them.
  const auto staged_bytes = (static_cast<std::size_t>(std::min(layout.chunk_size, layout.numel())) *
                                 sizeof(staged_item<T, Selection>) +
                             15) /
                            16 * 16;
  constexpr auto staged = select_chunks_kernel<T, Selection, true, Writer>;
  if (reserve_dynamic_shared_memory<staged>(staged_bytes, "dropit select_chunks_kernel")) {
    launch(staged, {grid, staged_bytes}, stream, layout, input, writer);
  } else {
    launch(select_chunks_kernel<T, Selection, false, Writer>, {grid}, stream, layout, input,
           writer);
  }
  check_launch("dropit select_chunks_kernel");
}

template <storage_type T>
void compress_elements(cudaStream_t stream, const T* input, const cache_view<T>& out,
                       const compress_scratch& scratch) {
  const cache_layout& layout = out.layout;
  if (layout.numel() == 0) return;
  auto* words = static_cast<std::uint32_t*>(out.positions);
  auto* offsets16 = static_cast<std::uint16_t*>(out.positions);
  auto* offsets32 = static_cast<std::uint32_t*>(out.positions);

  visit_selection(layout.selection, [&]<class S>(std::type_identity<S>) {
    using traits = selection_traits<S>;
    if constexpr (!traits::ranks_values) {  // seeded: values only
      static_assert(!traits::whole_tensor, "whole-tensor selections rank values");
      launch_select_chunks<S>(stream, layout, input, value_writer<T>{input, out.values});
    } else if constexpr (!traits::whole_tensor) {  // a block per chunk, 16-bit offsets
      if (layout.encoding == position_encoding::bitmask)
        launch_select_chunks<S>(stream, layout, input, bitmask_writer<T>{input, out.values, words});
      else
        launch_select_chunks<S>(stream, layout, input,
                                offset_writer<T, std::uint16_t>{input, out.values, offsets16});
    } else {  // one chunk, the whole tensor, over many blocks
      const selection_keys<S, T> keys{input, layout.seed, 0};
      const auto select = [&](const auto& writer) {
        select_global<std::uint32_t, magnitude_key_bits<T>>(
            stream, keys, layout.numel(), layout.kept_per_chunk, scratch.select, writer);
      };
      if (layout.encoding == position_encoding::bitmask)
        select(bitmask_writer<T>{input, out.values, words});
      else if (layout.offset_bytes == 2)
        select(offset_writer<T, std::uint16_t>{input, out.values, offsets16});
      else
        select(offset_writer<T, std::uint32_t>{input, out.values, offsets32});
    }
  });
}

/// Writes the ascending list of kept channels of a seeded cache to `list`: the generator draws of
/// its selection, regenerable without the input.
template <class T>
void select_drawn_channels(cudaStream_t stream, const cache_layout& layout,
                           const global_select_scratch& select, std::uint32_t* list) {
  visit_selection(layout.selection, [&]<class S>(std::type_identity<S>) {
    if constexpr (!selection_traits<S>::ranks_values)
      select_global<std::uint32_t, 32>(
          stream, selection_keys<S, T>{nullptr, layout.seed, channel_stream}, layout.channels,
          layout.kept_channels, select, index_writer{list});
  });
}

/// Writes the ascending list of kept channels to `list` where one launch does not compress them
/// whole: by score for selections that rank values (more than range_in_block_limit channels;
/// needs `input`), by generator draw otherwise (regenerable without it).
template <storage_type T>
void select_channels(cudaStream_t stream, const cache_layout& layout, const T* input,
                     const compress_scratch& scratch, std::uint32_t* list) {
  if (!layout.stores_positions()) {
    select_drawn_channels<T>(stream, layout, scratch.select, list);
    return;
  }
  if (scratch.runs > 0) {
    launch(channel_run_sums_kernel<T>, {grid_for(layout.channels * scratch.runs)}, stream, layout,
           input, scratch.runs, scratch.run_sums);
    check_launch("dropit channel_run_sums_kernel");
  }
  launch(channel_keys_kernel<>, {grid_for(layout.channels)}, stream, scratch.run_sums, scratch.runs,
         layout.channels, scratch.channel_keys);
  check_launch("dropit channel_keys_kernel");
  select_global<std::uint64_t, 64>(stream, stored_keys<std::uint64_t>{scratch.channel_keys},
                                   layout.channels, layout.kept_channels, scratch.select,
                                   index_writer{list});
}

/// Channel compress: channel min-k of at most range_in_block_limit channels in one cooperative
/// launch (channel_min_k_compress_kernel), else the selection of the kept channels' list, then
/// their gather.
template <storage_type T>
void compress_channels(cudaStream_t stream, const T* input, const cache_view<T>& out,
                       const compress_scratch& scratch) {
  const cache_layout& layout = out.layout;
  if (layout.channels == 0) return;
  std::uint32_t* list = layout.encoding == position_encoding::channel_list
                            ? static_cast<std::uint32_t*>(out.positions)
                            : scratch.channel_list;
  const std::int64_t count = layout.outer * layout.kept_channels * layout.inner;
  if (layout.stores_positions() && layout.channels <= range_in_block_limit) {
    constexpr auto kernel = channel_min_k_compress_kernel<T>;
    constexpr const char* name = "dropit channel_min_k_compress_kernel";
    // The more blocks of the two grid-wide phases' (a run or an element per thread), as many as
    // fit at once.
    const unsigned grid = std::min(grid_for(std::max(layout.channels * scratch.runs, count)),
                                   resident_blocks<kernel>(name));
    launch_cooperative(kernel, stream, grid, name, layout, input, scratch.runs, scratch.run_sums,
                       scratch.channel_keys, list, out.values);
    return;
  }
  select_channels(stream, layout, input, scratch, list);
  if (count == 0) return;
  launch(channel_gather_kernel<T>, {grid_for_walk(count)}, stream, layout, input, list, out.values);
  check_launch("dropit channel_gather_kernel");
}

/// The logical order of a tensor stored channels-last into `out`: a copy, so the kernel moves
/// the elements' bits.
template <storage_type T>
void transpose_channels_last(cudaStream_t stream, const T* input, T* out,
                             const channels_last_dims& d) {
  const channels_last_tiles tiles(d);
  if (tiles.count == 0) return;
  using bits = element_bits<T>;
  launch(transpose_channels_last_kernel<bits>, {grid_for(tiles.count, 1)}, stream,
         reinterpret_cast<const bits*>(input), reinterpret_cast<bits*>(out), d);
  check_launch("dropit transpose_channels_last_kernel");
}

/// Sparsifies `input`, stored contiguously or, where `channels_last` is set, channels-last (then
/// transposed into the workspace first, and selected as the contiguous tensor), into `out`.
template <storage_type T>
void compress(cudaStream_t stream, const T* input,
              const std::optional<channels_last_dims>& channels_last, const cache_view<T>& out,
              workspace memory) {
  workspace_carver carver(memory);
  const compress_scratch scratch = add_compress_scratch<T>(carver, out.layout, channels_last);
  const T* logical = input;
  if (channels_last) {
    auto* transposed = static_cast<T*>(scratch.logical_input);
    transpose_channels_last(stream, input, transposed, *channels_last);
    logical = transposed;
  }
  if (out.layout.channel_granularity)
    compress_channels(stream, logical, out, scratch);
  else
    compress_elements(stream, logical, out, scratch);
}

// ---------------------------------------------------------------------------------------------
// densify (into the element type, or into float for the weight gradients)

struct densify_scratch {
  std::uint32_t* mask_zeroed = nullptr;   // bitmask caches with long chunks: the look-back's words
  lookback_tiles mask_tiles;              // ... over tiles of mask_words_per_block words
  global_select_scratch select;           // seeded channel caches: regenerate the draw
  std::uint32_t* channel_list = nullptr;  // ... into this list
  std::int32_t* slot_of = nullptr;        // channel caches beyond channel_map_in_block_limit:
                                          // channel -> index in the list, or -1
};

inline std::int64_t mask_word_count(const cache_layout& layout) {
  return static_cast<std::int64_t>(layout.position_bytes() / 4);
}

inline std::int64_t mask_tile_count(const cache_layout& layout) {
  return (mask_word_count(layout) + mask_words_per_block - 1) / mask_words_per_block;
}

inline densify_scratch add_densify_scratch(workspace_carver& carver, const cache_layout& layout) {
  densify_scratch s;
  if (layout.channel_granularity) {
    if (layout.encoding == position_encoding::seeded) {
      s.select = add_global_select<std::uint32_t, 32>(carver, layout.channels);
      s.channel_list = carver.add<std::uint32_t>(static_cast<std::size_t>(layout.kept_channels));
    }
    if (layout.channels > channel_map_in_block_limit)
      s.slot_of = carver.add<std::int32_t>(static_cast<std::size_t>(layout.channels));
  } else if (layout.encoding == position_encoding::bitmask &&
             layout.mask_words_per_chunk() > max_chunk_mask_words) {
    const std::int64_t tiles = mask_tile_count(layout);
    s.mask_zeroed = carver.add<std::uint32_t>(lookback_tiles::zeroed_words(tiles));
    s.mask_tiles = add_lookback_tiles(carver, tiles, s.mask_zeroed);
  }
  return s;
}

template <class T, class Out>
void densify_elements(cudaStream_t stream, const cache_view<const T>& cache, Out* out,
                      const densify_scratch& scratch) {
  const cache_layout& layout = cache.layout;
  if (layout.numel() == 0) return;
  switch (layout.encoding) {
    case position_encoding::bitmask: {
      const auto* words = static_cast<const std::uint32_t*>(cache.positions);
      if (layout.mask_words_per_chunk() <= max_chunk_mask_words) {
        launch(chunk_densify_kernel<T, Out>, {grid_for(layout.chunk_count(), 1)}, stream, layout,
               words, cache.values, out);
        check_launch("dropit chunk_densify_kernel");
        return;
      }
      const std::int64_t tiles = mask_tile_count(layout);
      check(cudaMemsetAsync(scratch.mask_zeroed, 0,
                            lookback_tiles::zeroed_words(tiles) * sizeof(std::uint32_t), stream),
            "densify: clearing the counters");
      launch(mask_densify_kernel<T, Out>, {grid_for(tiles, 1)}, stream, layout, words,
             mask_word_count(layout), scratch.mask_tiles, cache.values, out);
      check_launch("dropit mask_densify_kernel");
      return;
    }
    case position_encoding::offsets: {
      if (layout.offset_bytes == 2) {  // chunks of at most 2^16: one launch
        launch(chunk_scatter_offsets_kernel<T, Out>, {grid_for(layout.chunk_count(), 1)}, stream,
               layout, cache.values, static_cast<const std::uint16_t*>(cache.positions), out);
        check_launch("dropit chunk_scatter_offsets_kernel");
        return;
      }
      // 32-bit offsets: min-k over a whole tensor, one chunk.
      launch(tile_scatter_offsets_kernel<T, Out>, {grid_for(layout.numel(), offsets_tile)}, stream,
             layout, cache.values, static_cast<const std::uint32_t*>(cache.positions), out);
      check_launch("dropit tile_scatter_offsets_kernel");
      return;
    }
    default:  // seeded: regenerate each chunk's draw and write the whole chunk
      visit_selection(layout.selection, [&]<class S>(std::type_identity<S>) {
        if constexpr (!selection_traits<S>::ranks_values)
          launch_select_chunks<S>(stream, layout, static_cast<const T*>(nullptr),
                                  dense_writer<T, Out>{cache.values, out, layout.rescale, 1.0f});
      });
  }
}

template <class T, class Out>
void densify_channels(cudaStream_t stream, const cache_view<const T>& cache, Out* out,
                      const densify_scratch& scratch) {
  const cache_layout& layout = cache.layout;
  const std::int64_t count = layout.outer * layout.channels * layout.inner;
  if (count == 0) return;
  const std::uint32_t* list = static_cast<const std::uint32_t*>(cache.positions);
  if (layout.encoding == position_encoding::seeded) {
    select_drawn_channels<T>(stream, layout, scratch.select, scratch.channel_list);
    list = scratch.channel_list;
  }
  if (layout.channels <= channel_map_in_block_limit) {  // one launch
    // Blocks enough to fill the device, few enough that building the map stays cheap.
    launch(channel_densify_kernel<T, Out, true>, {grid_for_walk(count)}, stream, layout, list,
           nullptr, cache.values, out);
    check_launch("dropit channel_densify_kernel");
    return;
  }
  check(cudaMemsetAsync(scratch.slot_of, 0xff,
                        static_cast<std::size_t>(layout.channels) * sizeof(std::int32_t), stream),
        "densify: clearing the channel map");
  if (layout.kept_channels > 0) {
    launch(channel_map_kernel<>, {grid_for(layout.kept_channels)}, stream, list,
           layout.kept_channels, scratch.slot_of);
    check_launch("dropit channel_map_kernel");
  }
  launch(channel_densify_kernel<T, Out, false>, {grid_for_walk(count)}, stream, layout, list,
         scratch.slot_of, cache.values, out);
  check_launch("dropit channel_densify_kernel");
}

template <class T, class Out>
void densify(cudaStream_t stream, const cache_view<const T>& cache, Out* out,
             const densify_scratch& scratch) {
  if (cache.layout.channel_granularity)
    densify_channels(stream, cache, out, scratch);
  else
    densify_elements(stream, cache, out, scratch);
}

// ---------------------------------------------------------------------------------------------
// ReLU masks

/// Whether every pointer given (null ones aside) allows 16-byte loads and stores.
inline bool vector_aligned(std::initializer_list<const void*> pointers) {
  return std::all_of(pointers.begin(), pointers.end(),
                     [](const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; });
}

/// Blocks for warp tiles of `tile_items` elements over `n` elements: one warp per tile.
inline unsigned grid_for_tiles(std::int64_t n, std::int64_t tile_items) {
  return grid_for((n + tile_items - 1) / tile_items, block_threads / 32);
}

/// `launch(width)` with width::value the elements a thread loads at once: a 16-byte vector's where
/// every pointer allows it, else one.
template <class T, class Launch>
void with_vector_width(std::initializer_list<const void*> pointers, Launch&& launch) {
  if (vector_aligned(pointers))
    launch(std::integral_constant<int, vector_items<T>>{});
  else
    launch(std::integral_constant<int, 1>{});
}

template <storage_type T>
void pack_relu_mask(cudaStream_t stream, const T* x, T* y, std::int64_t n, std::uint32_t* words) {
  if (n == 0) return;
  with_vector_width<T>({x, y}, [&](auto width) {
    constexpr int V = decltype(width)::value;
    launch(pack_relu_mask_kernel<T, V>, {grid_for_tiles(n, 32 * V)}, stream, x, y, n, words);
  });
  check_launch("dropit pack_relu_mask_kernel");
}

template <storage_type T>
void apply_relu_mask(cudaStream_t stream, const std::uint32_t* words, const T* dy, T* dx,
                     std::int64_t n) {
  if (n == 0) return;
  with_vector_width<T>({dy, dx}, [&](auto width) {
    constexpr int V = decltype(width)::value;
    launch(apply_relu_mask_kernel<T, V>, {grid_for_tiles(n, 32 * V)}, stream, words, dy, dx, n);
  });
  check_launch("dropit apply_relu_mask_kernel");
}

template <storage_type T>
void pack_relu_mask_channels_last(cudaStream_t stream, const T* x, T* y,
                                  const channels_last_dims& d, std::uint32_t* words) {
  const channels_last_tiles tiles(d);
  if (tiles.count == 0) return;
  launch(pack_relu_mask_channels_last_kernel<T>, {grid_for(tiles.count, 1)}, stream, x, y, d,
         words);
  check_launch("dropit pack_relu_mask_channels_last_kernel");
}

template <storage_type T>
void apply_relu_mask_channels_last(cudaStream_t stream, const std::uint32_t* words, const T* dy,
                                   T* dx, const channels_last_dims& d) {
  const channels_last_tiles tiles(d);
  if (tiles.count == 0) return;
  launch(apply_relu_mask_channels_last_kernel<T>, {grid_for(tiles.count, 1)}, stream, words, dy, dx,
         d);
  check_launch("dropit apply_relu_mask_channels_last_kernel");
}

}  // namespace dropit::detail::cuda
