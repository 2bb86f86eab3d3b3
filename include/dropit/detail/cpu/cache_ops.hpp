#pragma once
// CPU compress, and the one decoder every reader of a cache (densify, weight gradients) goes
// through. Element caches are processed chunk by chunk: each chunk's values and positions start
// at offsets computable from the layout, so chunks run in parallel with no coordination.

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cstdint>
#include <new>
#include <numeric>
#include <optional>
#include <type_traits>

#include "../../cache.hpp"
#include "../../policy.hpp"
#include "../../shape.hpp"
#include "../common/keys.hpp"
#include "../common/workspace.hpp"
#include "parallel.hpp"
#include "select.hpp"
#include "simd.hpp"

namespace dropit::detail::cpu {

// ---------------------------------------------------------------------------------------------
// Element granularity.

/// Selection keys of elements [first, last) of one chunk into `keys[first, last)`, from the
/// layout's selection: ranked values of the chunk's elements `data`, or generator draws
/// (regenerable without them).
template <storage_type T>
void range_keys(const cache_layout& layout, const T* data, std::int64_t chunk, std::int64_t first,
                std::int64_t last, std::uint32_t* keys) {
  const auto stream = static_cast<std::uint64_t>(chunk);
  visit_selection(layout.selection, [&]<class S>(std::type_identity<S>) {
    using traits = selection_traits<S>;
    if constexpr (traits::ranks_values) {
      for (std::int64_t i = first; i < last; ++i)
        keys[i] = traits::key(data[i], layout.seed, stream, static_cast<std::uint64_t>(i));
    } else {  // 32-bit indices (chunks hold at most 2^16): the draws vectorise as 32-bit lanes
      for (auto i = static_cast<std::uint32_t>(first); i < last; ++i)
        keys[i] = traits::key(T{}, layout.seed, stream, i);
    }
  });
}

/// Selection keys of a whole chunk, whose elements are `data`, into `keys[0, length)`.
template <storage_type T>
void chunk_keys(const cache_layout& layout, const T* data, std::int64_t chunk,
                std::uint32_t* keys) {
  range_keys(layout, data, chunk, 0, layout.chunk_length(chunk), keys);
}

/// Scratch keys one thread needs for an element layout: the longest chunk's keys and the
/// selection's (a tensor smaller than one chunk needs only its own length).
inline std::int64_t element_scratch_keys(const cache_layout& layout) {
  const std::int64_t longest = std::min(layout.chunk_size, layout.numel());
  return longest + select_scratch_keys(longest);
}

/// The cut keeping `kept_in_chunk(chunk)` of the chunk's keys (in `scratch`, followed by the
/// selection's scratch).
inline threshold chunk_threshold(const cache_layout& layout, std::int64_t chunk,
                                 std::uint32_t* scratch) {
  const std::int64_t length = layout.chunk_length(chunk);
  return select_threshold(scratch, length, layout.kept_in_chunk(chunk), scratch + length);
}

/// Elements handed out per parallel work item, at least: small chunks go in groups, so that
/// scheduling costs little against their work (and the partition never changes a result).
inline constexpr std::int64_t chunk_group_elements = 4096;

/// Calls `body(chunk, thread)` for every chunk of an element layout, in parallel.
template <class Body>
void for_each_chunk(const cpu_backend& backend, const cache_layout& layout, Body&& body) {
  const std::int64_t chunks = layout.chunk_count();
  const std::int64_t group = std::max<std::int64_t>(
      1, chunk_group_elements / std::max<std::int64_t>(1, layout.chunk_size));
  parallel_for(backend, (chunks + group - 1) / group, [&](std::int64_t item, int thread) {
    const std::int64_t end = std::min(chunks, (item + 1) * group);
    for (std::int64_t chunk = item * group; chunk < end; ++chunk) body(chunk, thread);
  });
}

/// Stores the kept elements among positions [first, first + length) of `chunk`, whose elements
/// are `chunk_data` and the keys of those positions `keys[0, length)`, under `cut`: their values
/// from the chunk's value `stored_before` on, and their positions in the layout's encoding.
/// `first` is a multiple of 32, so bitmask words are whole.
template <storage_type T>
void emit_kept_kernel(const cache_layout& layout, const T* chunk_data, std::int64_t chunk,
                      std::int64_t first, std::int64_t length, const std::uint32_t* keys,
                      threshold cut, const cache_view<T>& out, std::int64_t stored_before) {
  const T* data = chunk_data + first;
  T* values = out.values + layout.values_begin(chunk) + stored_before;
  // Kept indices come a block at a time; the loops over them have fixed trip counts.
  const auto no_words = [](std::int64_t, std::uint32_t) {};
  std::int64_t stored = 0;
  const auto store_values = [&](std::int64_t block_first, const std::uint32_t* indices,
                                std::int64_t count) {
    const T* block = data + block_first;
    for (std::int64_t j = 0; j < count; ++j) values[stored + j] = block[indices[j]];
    stored += count;
  };
  switch (layout.encoding) {
    case position_encoding::bitmask: {
      auto* words =
          static_cast<std::uint32_t*>(out.positions) + layout.mask_word_begin(chunk) + first / 32;
      for_each_selected_block(
          keys, length, cut, [&](std::int64_t word, std::uint32_t bits) { words[word] = bits; },
          store_values);
      break;
    }
    case position_encoding::offsets: {
      const auto store_offsets = [&]<class Offset>(Offset* offsets) {
        offsets += layout.values_begin(chunk) + stored_before;
        for_each_selected_block(
            keys, length, cut, no_words,
            [&](std::int64_t block_first, const std::uint32_t* indices, std::int64_t count) {
              const std::int64_t base = first + block_first;
              for (std::int64_t j = 0; j < count; ++j)
                offsets[stored + j] = static_cast<Offset>(base + indices[j]);
              store_values(block_first, indices, count);
            });
      };
      if (layout.offset_bytes == 2)
        store_offsets(static_cast<std::uint16_t*>(out.positions));
      else
        store_offsets(static_cast<std::uint32_t*>(out.positions));
      break;
    }
    default:  // seeded: values only
      for_each_selected_block(keys, length, cut, no_words, store_values);
  }
}
DROPIT_CPU_DISPATCH(emit_kept)

/// Compresses `chunk`, whose elements are `data`.
template <storage_type T>
void compress_chunk_kernel(const cache_layout& layout, const T* data, std::int64_t chunk,
                           const cache_view<T>& out, std::uint32_t* scratch) {
  std::uint32_t* keys = scratch;
  chunk_keys(layout, data, chunk, keys);
  const threshold cut = chunk_threshold(layout, chunk, keys);
  emit_kept_kernel(layout, data, chunk, 0, layout.chunk_length(chunk), keys, cut, out, 0);
}
DROPIT_CPU_DISPATCH(compress_chunk)

/// Set bits among mask words [first, last).
inline std::int64_t count_set_bits_kernel(const std::uint32_t* words, std::int64_t first,
                                          std::int64_t last) {
  std::int64_t count = 0;
  for (std::int64_t w = first; w < last; ++w) count += std::popcount(words[w]);
  return count;
}
DROPIT_CPU_DISPATCH(count_set_bits)

/// Whether the mask `words` of a chunk of `length` elements sets no bit past the chunk's end.
inline bool mask_tail_clear(const std::uint32_t* words, std::int64_t length) {
  return length % 32 == 0 || words[(length + 31) / 32 - 1] >> (length % 32) == 0;
}

/// Whether the mask `words` of a chunk of `length` elements sets exactly `kept` bits, none past
/// the chunk's end: stored positions come from the caller's buffers, so they are checked before
/// any value is read by them.
inline bool mask_matches(const std::uint32_t* words, std::int64_t length, std::int64_t kept) {
  return mask_tail_clear(words, length) &&
         count_set_bits_kernel(words, 0, (length + 31) / 32) == kept;
}

/// Calls `visit(begin + bit, value++)` for each set bit of mask words [first, last) (bit counted
/// from word 0), ascending; returns the next value index.
template <class Visit>
DROPIT_ALWAYS_INLINE std::int64_t visit_set_bits(const std::uint32_t* words, std::int64_t first,
                                                 std::int64_t last, std::int64_t begin,
                                                 std::int64_t value, Visit&& visit) {
  for (std::int64_t w = first; w < last; ++w)
    for (std::uint32_t bits = words[w]; bits != 0; bits &= bits - 1)
      visit(begin + w * 32 + std::countr_zero(bits), value++);
  return value;
}

/// Calls `visit(flat_position, value_index)` for every kept element of `chunk`, ascending.
/// `scratch` is `element_scratch_keys` keys (used only by seeded caches). Stored positions come
/// from the caller's buffers, so they are checked before they are used: false (and nothing visited
/// from there on) where they do not encode exactly the chunk's kept count inside the chunk.
template <class T, class Visit>
bool for_each_kept_in_chunk_kernel(const cache_view<T>& cache, std::int64_t chunk,
                                   std::uint32_t* scratch, Visit&& visit) {
  const cache_layout& layout = cache.layout;
  const std::int64_t begin = layout.chunk_begin(chunk);
  const std::int64_t length = layout.chunk_length(chunk);
  const std::int64_t kept = layout.kept_in_chunk(chunk);
  const std::int64_t first_value = layout.values_begin(chunk);
  switch (layout.encoding) {
    case position_encoding::bitmask: {
      const auto* words =
          static_cast<const std::uint32_t*>(cache.positions) + layout.mask_word_begin(chunk);
      if (!mask_matches(words, length, kept)) return false;
      visit_set_bits(words, 0, (length + 31) / 32, begin, first_value, visit);
      break;
    }
    case position_encoding::offsets:
      for (std::int64_t j = 0, previous = -1; j < kept; ++j) {
        const std::int64_t offset =
            layout.offset_bytes == 2
                ? static_cast<const std::uint16_t*>(cache.positions)[first_value + j]
                : static_cast<const std::uint32_t*>(cache.positions)[first_value + j];
        if (offset <= previous || offset >= length) return false;
        previous = offset;
        visit(begin + offset, first_value + j);
      }
      break;
    default: {  // seeded: regenerate the draw made in compress
      chunk_keys<std::remove_const_t<T>>(layout, nullptr, chunk, scratch);
      const threshold cut = chunk_threshold(layout, chunk, scratch);
      std::int64_t value = first_value;
      for_each_selected(scratch, length, cut, [&](std::int64_t i) { visit(begin + i, value++); });
    }
  }
  return true;
}
DROPIT_CPU_DISPATCH(for_each_kept_in_chunk)

// ---------------------------------------------------------------------------------------------
// Channel granularity.

/// Sum of squares of one channel in the canonical order of `channel_score_block`.
template <storage_type T>
double channel_score(const cache_layout& layout, const T* input, std::int64_t channel) {
  double total = 0.0, run = 0.0;
  std::int64_t in_run = 0;
  for (std::int64_t o = 0; o < layout.outer; ++o) {
    const T* row = input + (o * layout.channels + channel) * layout.inner;
    for (std::int64_t r = 0; r < layout.inner; ++r) {
      const double x = to_float(row[r]);
      run += x * x;
      if (++in_run == channel_score_block) {
        total += run;
        run = 0.0;
        in_run = 0;
      }
    }
  }
  return total + run;
}

/// Scratch a channel selection needs: scores and an ordering of the channels.
inline void add_channel_scratch(workspace_carver& carver, const cache_layout& layout,
                                double*& scores, std::uint32_t*& order) {
  scores = carver.add<double>(layout.channels);
  order = carver.add<std::uint32_t>(layout.channels);
}

/// Writes the `kept_channels` selected channels to `kept`, ascending. Selections that rank values
/// rank channels by score (needs `input`); the others by generator draws (regenerable without it).
template <storage_type T>
void select_channels(const cpu_backend& backend, const cache_layout& layout, const T* input,
                     double* scores, std::uint32_t* order, std::uint32_t* kept) {
  const std::int64_t channels = layout.channels;
  visit_selection(layout.selection, [&]<class S>(std::type_identity<S>) {
    using traits = selection_traits<S>;
    parallel_for(backend, channels, [&](std::int64_t c, int) {
      if constexpr (traits::ranks_values)
        scores[c] = channel_score(layout, input, c);
      else
        scores[c] = static_cast<double>(
            traits::key(T{}, layout.seed, channel_stream, static_cast<std::uint64_t>(c)));
    });
  });
  std::iota(order, order + channels, 0u);
  std::sort(order, order + channels, [&](std::uint32_t a, std::uint32_t b) {
    return channel_ranks_before(scores[a], a, scores[b], b);
  });
  std::copy_n(order, layout.kept_channels, kept);
  std::sort(kept, kept + layout.kept_channels);
}

/// The kept channel list of a channel cache: stored, or regenerated for seeded caches into
/// `regenerated` (with the scratch of `add_channel_scratch`).
template <class T>
const std::uint32_t* kept_channels(const cpu_backend& backend, const cache_view<T>& cache,
                                   double* scores, std::uint32_t* order,
                                   std::uint32_t* regenerated) {
  if (cache.layout.encoding == position_encoding::channel_list) {
    const auto* list = static_cast<const std::uint32_t*>(cache.positions);
    for (std::int64_t j = 0; j < cache.layout.kept_channels; ++j)
      expect(list[j] < cache.layout.channels && (j == 0 || list[j] > list[j - 1]),
             "cache channel list entry ", j, " is channel ", list[j],
             "; expected ascending "
             "channels below ",
             cache.layout.channels);
    return list;
  }
  select_channels<std::remove_const_t<T>>(backend, cache.layout, nullptr, scores, order,
                                          regenerated);
  return regenerated;
}

// ---------------------------------------------------------------------------------------------
// One long chunk, selected by all threads together (min-k over a whole tensor).

/// Chunks at least this long are selected by all threads together when a layout has only one
/// chunk: otherwise one thread would key, count and emit the whole tensor alone.
inline constexpr std::int64_t shared_chunk_elements = std::int64_t{1} << 16;

/// Whether compress selects the layout's only chunk with every thread (see shared_chunk_elements).
inline bool selects_shared_chunk(const cpu_backend& backend, const cache_layout& layout) {
  return layout.chunk_count() == 1 && layout.chunk_length(0) >= shared_chunk_elements &&
         backend.thread_count() > 1;
}

/// What the shared selection tracks of each range of the chunk.
struct shared_range {
  std::int64_t candidates_before = 0;  // candidates of the ranges before, in the bin of the cut
  std::int64_t above = 0, equal = 0;   // keys above the cut and equal to it
  std::int64_t ties = 0;               // keys equal to the cut that this range keeps
  std::int64_t values_before = 0;      // kept values of the ranges before
};

/// Scratch of the shared selection: a histogram and the counts of each range of the chunk.
struct shared_chunk_scratch {
  std::int64_t ranges = 0;
  radix_histogram* histograms = nullptr;
  shared_range* counts = nullptr;
};

inline shared_chunk_scratch add_shared_chunk_scratch(workspace_carver& carver,
                                                     const cpu_backend& backend) {
  shared_chunk_scratch scratch;
  scratch.ranges = 4 * std::int64_t{backend.thread_count()};  // a few per thread, for balance
  scratch.histograms = carver.add<radix_histogram>(scratch.ranges);
  scratch.counts = carver.add<shared_range>(scratch.ranges);
  return scratch;
}

/// The keys of positions [first, last) of chunk 0 into `keys[first, last)`, and their histogram.
template <storage_type T>
void key_range_kernel(const cache_layout& layout, const T* input, std::int64_t first,
                      std::int64_t last, std::uint32_t* keys, radix_histogram* histogram) {
  range_keys(layout, input, 0, first, last, keys);
  new (histogram) radix_histogram(keys + first, last - first);
}
DROPIT_CPU_DISPATCH(key_range)

/// Keys of `keys[0, n)` above `cut` and equal to it.
DROPIT_ALWAYS_INLINE void count_cut_kernel(const std::uint32_t* keys, std::int64_t n,
                                           std::uint32_t cut, std::int64_t* above,
                                           std::int64_t* equal) {
  std::int64_t greater = 0, same = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    greater += keys[i] > cut;
    same += keys[i] == cut;
  }
  *above = greater;
  *equal = same;
}
DROPIT_CPU_DISPATCH(count_cut)

/// `collect_bin` compiled for the widest instruction set, for the ranges of a shared chunk.
DROPIT_ALWAYS_INLINE std::int64_t collect_range_bin_kernel(const std::uint32_t* keys,
                                                           std::int64_t n, std::uint32_t bin,
                                                           std::uint32_t* out) {
  return collect_bin(keys, n, bin, out);
}
DROPIT_CPU_DISPATCH(collect_range_bin)

/// The histograms of all ranges, summed on the fly (choose_bin reads a few bins only).
struct summed_histogram {
  const radix_histogram* histograms;
  std::int64_t ranges;
  std::size_t top = 0;
  std::int64_t operator[](std::size_t bin) const {
    std::int64_t total = 0;
    for (std::int64_t r = 0; r < ranges; ++r) total += histograms[r][bin];
    return total;
  }
};

/// Compress of a layout's only chunk by every thread: each range of the chunk is keyed and
/// counted, then its candidates gathered, and after the cut is known each range emits its kept
/// elements at the slot the ranges before it leave, taking the ties the ranges before it left (so
/// ties still go to the lower index). `keys` holds 2 x the chunk's length.
template <storage_type T>
void compress_shared_chunk(const cpu_backend& backend, const cache_layout& layout, const T* input,
                           const cache_view<T>& out, std::uint32_t* keys,
                           const shared_chunk_scratch& scratch) {
  const std::int64_t n = layout.chunk_length(0), k = layout.kept_in_chunk(0);
  const std::int64_t ranges = scratch.ranges;
  const std::int64_t span = ((n + ranges - 1) / ranges + 31) / 32 * 32;  // whole mask words
  const auto first_of = [&](std::int64_t r) { return std::min(n, r * span); };
  shared_range* counts = scratch.counts;

  parallel_for(backend, ranges, [&](std::int64_t r, int) {
    key_range(layout, input, first_of(r), first_of(r + 1), keys, scratch.histograms + r);
  });
  threshold cut{0, n};  // every key is >= 0: keep all
  if (k < n) {
    summed_histogram histogram{scratch.histograms, ranges};
    for (std::int64_t r = 0; r < ranges; ++r)
      histogram.top = std::max(histogram.top, scratch.histograms[r].top);
    const bin_choice choice = choose_bin(histogram, k);
    // Each range's candidates go after those of the ranges before it.
    std::uint32_t* candidates = keys + n;
    std::int64_t total = 0;
    for (std::int64_t r = 0; r < ranges; ++r) {
      counts[r].candidates_before = total;
      total += scratch.histograms[r][choice.bin];
    }
    parallel_for(backend, ranges, [&](std::int64_t r, int) {
      collect_range_bin(keys + first_of(r), first_of(r + 1) - first_of(r), choice.bin,
                        candidates + counts[r].candidates_before);
    });
    cut = narrow_candidates(candidates, total, k - choice.above);
  }
  parallel_for(backend, ranges, [&](std::int64_t r, int) {
    count_cut(keys + first_of(r), first_of(r + 1) - first_of(r), cut.key, &counts[r].above,
              &counts[r].equal);
  });
  std::int64_t ties_left = cut.ties, stored = 0;
  for (std::int64_t r = 0; r < ranges; ++r) {
    counts[r].ties = std::min(counts[r].equal, ties_left);
    ties_left -= counts[r].ties;
    counts[r].values_before = stored;
    stored += counts[r].above + counts[r].ties;
  }
  parallel_for(backend, ranges, [&](std::int64_t r, int) {
    const std::int64_t first = first_of(r);
    emit_kept(layout, input, std::int64_t{0}, first, first_of(r + 1) - first, keys + first,
              threshold{cut.key, counts[r].ties}, out, counts[r].values_before);
  });
}

// ---------------------------------------------------------------------------------------------
// Whole-cache walks.

/// The kept value at flat `position` as backward uses it: in float, times n/k when the layout
/// rescales. This unrounded product is what the weight gradients use; densify rounds it once to
/// the element type (so a 16-bit densify can differ from it by that rounding, or overflow).
template <storage_type T>
float scaled_value(const cache_layout& layout, T value, std::int64_t position) {
  const std::int64_t chunk = layout.channel_granularity ? 0 : position / layout.chunk_size;
  return to_float(value) * layout.value_scale(chunk);
}

/// Scratch carved for reading a cache: per-thread chunk keys, or the channel list.
struct read_scratch {
  std::uint32_t* keys = nullptr;  // element: threads * element_scratch_keys
  std::int64_t keys_per_thread = 0;
  shared_chunk_scratch shared;  // compress of one long chunk (selects_shared_chunk)
  double* scores = nullptr;     // channel: see add_channel_scratch
  std::uint32_t* order = nullptr;
  std::uint32_t* channel_list = nullptr;
};

inline read_scratch add_read_scratch(workspace_carver& carver, const cpu_backend& backend,
                                     const cache_layout& layout, bool needs_input_selection) {
  read_scratch scratch;
  if (layout.channel_granularity) {
    if (needs_input_selection || layout.encoding == position_encoding::seeded) {
      add_channel_scratch(carver, layout, scratch.scores, scratch.order);
      scratch.channel_list = carver.add<std::uint32_t>(layout.kept_channels);
    }
  } else if (needs_input_selection || layout.encoding == position_encoding::seeded) {
    const auto threads = std::max<std::int64_t>(
        1, std::min<std::int64_t>(backend.thread_count(), layout.chunk_count()));
    scratch.keys_per_thread = element_scratch_keys(layout);
    scratch.keys = carver.add<std::uint32_t>(threads, scratch.keys_per_thread);
    if (needs_input_selection && selects_shared_chunk(backend, layout))
      scratch.shared = add_shared_chunk_scratch(carver, backend);
  }
  return scratch;
}

/// A bitmask cache of one chunk (min-k over the whole tensor) is read by several threads, each
/// over a run of blocks of this many mask words (2^14 positions, whose densified floats stay in
/// cache between the zeroing and the writes): the set bits before each run are counted first.
inline constexpr std::int64_t mask_block_words = 512;
inline constexpr int max_mask_runs = 64;

/// Calls `enter(first, count)` for each block of mask words [first_word, last_word) (positions
/// [first, first + count) of a chunk of `length` from 0), then `visit` for its set bits, value
/// indices from `value`.
template <class Enter, class Visit>
void visit_mask_blocks_kernel(const std::uint32_t* words, std::int64_t first_word,
                              std::int64_t last_word, std::int64_t length, std::int64_t value,
                              Enter&& enter, Visit&& visit) {
  for (std::int64_t block = first_word; block < last_word; block += mask_block_words) {
    const std::int64_t block_end = std::min(last_word, block + mask_block_words);
    enter(block * 32, std::min(length, block_end * 32) - block * 32);
    value = visit_set_bits(words, block, block_end, 0, value, visit);
  }
}
DROPIT_CPU_DISPATCH(visit_mask_blocks)

/// for_each_kept over a one-chunk bitmask cache, its mask split into runs of whole blocks, one
/// work item each. False (nothing visited) where the mask does not set exactly the kept count.
template <class T, class Enter, class Visit>
bool for_each_kept_in_split_mask(const cpu_backend& backend, const cache_view<T>& cache,
                                 Enter&& enter, Visit&& visit) {
  const std::int64_t length = cache.layout.numel();
  const auto* words = static_cast<const std::uint32_t*>(cache.positions);
  const std::int64_t word_count = (length + 31) / 32;
  if (!mask_tail_clear(words, length)) return false;
  const std::int64_t blocks = (word_count + mask_block_words - 1) / mask_block_words;
  const std::int64_t runs =
      std::min<std::int64_t>({blocks, backend.thread_count(), std::int64_t{max_mask_runs}});
  const std::int64_t run_words = (blocks + runs - 1) / runs * mask_block_words;
  const auto run_begin = [&](std::int64_t run) { return std::min(word_count, run * run_words); };
  std::array<std::int64_t, max_mask_runs + 1> values_before{};
  parallel_for(backend, runs, [&](std::int64_t run, int) {
    values_before[run + 1] = count_set_bits(words, run_begin(run), run_begin(run + 1));
  });
  for (std::int64_t run = 0; run < runs; ++run) values_before[run + 1] += values_before[run];
  if (values_before[runs] != cache.layout.kept()) return false;
  parallel_for(backend, runs, [&](std::int64_t run, int) {
    visit_mask_blocks(words, run_begin(run), run_begin(run + 1), length, values_before[run], enter,
                      visit);
  });
  return true;
}

/// Calls `visit(flat_position, value_index)` for every kept element, ascending within each
/// parallel work item (a chunk, a run of mask blocks of a one-chunk bitmask cache, or an outer
/// index for channel caches), after `enter(first, count)` for each span of positions it covers
/// (each chunk's, outer index's or mask block's): densify zeroes them there, so that its writes
/// meet in cache rather than after a pass over the whole output.
template <class T, class Enter, class Visit>
void for_each_kept(const cpu_backend& backend, const cache_view<T>& cache,
                   const read_scratch& scratch, Enter&& enter, Visit&& visit) {
  const cache_layout& layout = cache.layout;
  if (layout.channel_granularity) {
    const std::uint32_t* list =
        kept_channels(backend, cache, scratch.scores, scratch.order, scratch.channel_list);
    const std::int64_t kept = layout.kept_channels, inner = layout.inner;
    const std::int64_t slab = layout.channels * inner;
    parallel_for(backend, layout.outer, [&](std::int64_t o, int) {
      enter(o * slab, slab);
      for (std::int64_t j = 0; j < kept; ++j) {
        const std::int64_t position = (o * layout.channels + list[j]) * inner;
        const std::int64_t value = (o * kept + j) * inner;
        for (std::int64_t r = 0; r < inner; ++r) visit(position + r, value + r);
      }
    });
    return;
  }
  // Exceptions cannot leave a parallel region: a bad chunk is recorded and reported after it.
  std::atomic<std::int64_t> bad_chunk{-1};
  if (layout.chunk_count() == 1 && layout.encoding == position_encoding::bitmask) {
    if (!for_each_kept_in_split_mask(backend, cache, enter, visit)) bad_chunk = 0;
  } else {
    for_each_chunk(backend, layout, [&](std::int64_t chunk, int thread) {
      enter(layout.chunk_begin(chunk), layout.chunk_length(chunk));
      if (!for_each_kept_in_chunk(cache, chunk, scratch.keys + thread * scratch.keys_per_thread,
                                  visit))
        bad_chunk.store(chunk, std::memory_order_relaxed);
    });
  }
  const std::int64_t bad = bad_chunk.load();
  expect(bad < 0, "cache positions of chunk ", bad, " do not match the layout: expected ",
         layout.kept_in_chunk(std::max<std::int64_t>(bad, 0)), " ascending ",
         name_of(layout.encoding), " positions below the chunk length ",
         layout.chunk_length(std::max<std::int64_t>(bad, 0)));
}

// ---------------------------------------------------------------------------------------------
// Inputs stored channels-last, read in logical order.

/// Channels [channel_begin, channel_end) at pixels [pixel_begin, pixel_end) of one channels-last
/// image `pixels` (rows of `channels` elements) into `out[offset + channel * plane + pixel]`:
/// blocks of 16 pixels by 8 channels go through a tile (16 short row reads, 8 column writes of
/// a float's cache line each), the edges element by element.
template <class T>
void copy_channels_last_block(const T* pixels, std::int64_t channels, std::int64_t plane,
                              std::int64_t channel_begin, std::int64_t channel_end,
                              std::int64_t pixel_begin, std::int64_t pixel_end, T* out,
                              std::int64_t offset) {
  constexpr std::int64_t pixel_block = 16, channel_block = 8;
  for (std::int64_t p0 = pixel_begin; p0 < pixel_end; p0 += pixel_block) {
    const std::int64_t pixel_count = std::min(pixel_block, pixel_end - p0);
    for (std::int64_t c0 = channel_begin; c0 < channel_end; c0 += channel_block) {
      const std::int64_t channel_count = std::min(channel_block, channel_end - c0);
      const T* rows = pixels + p0 * channels + c0;
      T* columns = out + (offset + c0 * plane + p0);
      if (pixel_count == pixel_block && channel_count == channel_block) {
        T tile[channel_block][pixel_block];
        for (std::int64_t i = 0; i < pixel_block; ++i)
          for (std::int64_t j = 0; j < channel_block; ++j) tile[j][i] = rows[i * channels + j];
        for (std::int64_t j = 0; j < channel_block; ++j)
          for (std::int64_t i = 0; i < pixel_block; ++i) columns[j * plane + i] = tile[j][i];
      } else {
        for (std::int64_t j = 0; j < channel_count; ++j)
          for (std::int64_t i = 0; i < pixel_count; ++i)
            columns[j * plane + i] = rows[i * channels + j];
      }
    }
  }
}

/// Elements [first, first + length) of a tensor stored channels-last, in its logical order, into
/// `out[0, length)`. Within an image the range is channels first_channel to last_channel, the
/// first from pixel first_pixel on and the last up to end_pixel.
template <class T>
void gather_channels_last(const channels_last_dims& d, const T* input, std::int64_t first,
                          std::int64_t length, T* out) {
  const std::int64_t plane = d.pixels, image_size = d.channels * d.pixels;
  for (std::int64_t position = first, end = first + length; position < end;) {
    const std::int64_t image = position / image_size;
    const std::int64_t image_end = std::min(end, (image + 1) * image_size);
    const std::int64_t begin = position - image * image_size,
                       finish = image_end - image * image_size;
    const std::int64_t first_channel = begin / plane, first_pixel = begin % plane;
    const std::int64_t last_channel = (finish - 1) / plane, end_pixel = (finish - 1) % plane + 1;
    const T* pixels = input + image * image_size;
    // out[offset + logical offset in the image] for the range's part of this image.
    const std::int64_t offset = (position - first) - begin;
    const auto copy = [&](std::int64_t c0, std::int64_t c1, std::int64_t p0, std::int64_t p1) {
      copy_channels_last_block(pixels, d.channels, plane, c0, c1, p0, p1, out, offset);
    };
    if (first_channel == last_channel) {
      copy(first_channel, first_channel + 1, first_pixel, end_pixel);
    } else {
      copy(first_channel, first_channel + 1, first_pixel, plane);
      copy(first_channel + 1, last_channel, 0, plane);
      copy(last_channel, last_channel + 1, 0, end_pixel);
    }
    position = image_end;
  }
}

/// The whole of a tensor stored channels-last, in logical order, into `out`.
template <class T>
void transpose_channels_last(const cpu_backend& backend, const channels_last_dims& d,
                             const T* input, T* out) {
  constexpr std::int64_t range = std::int64_t{1} << 16;
  const std::int64_t n = d.images * d.channels * d.pixels;
  parallel_for(backend, (n + range - 1) / range, [&](std::int64_t r, int) {
    const std::int64_t first = r * range;
    gather_channels_last(d, input, first, std::min(range, n - first), out + first);
  });
}

/// Whether compress reads a channels-last input as a transposed copy of the whole of it: a
/// channel selection, or one chunk shared by every thread. Otherwise each thread gathers the chunk
/// it selects.
inline bool transposes_whole_input(const cpu_backend& backend, const cache_layout& layout) {
  return layout.channel_granularity || selects_shared_chunk(backend, layout);
}

/// Where compress puts a channels-last input in logical order (see transposes_whole_input).
template <class T>
struct logical_input_scratch {
  T* chunks = nullptr;  // thread t's chunk at t * chunk_elements
  std::int64_t chunk_elements = 0;
  T* whole = nullptr;
};

template <class T>
logical_input_scratch<T> add_logical_input_scratch(
    workspace_carver& carver, const cpu_backend& backend, const cache_layout& layout,
    const std::optional<channels_last_dims>& channels_last) {
  logical_input_scratch<T> scratch;
  if (!channels_last) return scratch;
  if (transposes_whole_input(backend, layout)) {
    scratch.whole = carver.add<T>(layout.numel());
  } else {
    const auto threads = std::max<std::int64_t>(
        1, std::min<std::int64_t>(backend.thread_count(), layout.chunk_count()));
    scratch.chunk_elements = std::min(layout.chunk_size, layout.numel());
    scratch.chunks = carver.add<T>(threads, scratch.chunk_elements);
  }
  return scratch;
}

// ---------------------------------------------------------------------------------------------
// compress and densify.

template <storage_type T>
std::size_t compress_workspace_bytes(const cpu_backend& backend, const cache_layout& layout,
                                     const std::optional<channels_last_dims>& channels_last) {
  workspace_carver carver;
  add_read_scratch(carver, backend, layout, true);
  add_logical_input_scratch<T>(carver, backend, layout, channels_last);
  return carver.bytes();
}

/// Sparsifies `input`, stored contiguously or, where `channels_last` is set, channels-last, into
/// `out`. Either way the cache is that of the tensor's logical order.
template <storage_type T>
void compress(const cpu_backend& backend, const T* input,
              const std::optional<channels_last_dims>& channels_last, const cache_view<T>& out,
              workspace memory) {
  const cache_layout& layout = out.layout;
  workspace_carver carver(memory);
  const read_scratch scratch = add_read_scratch(carver, backend, layout, true);
  const logical_input_scratch<T> reordered =
      add_logical_input_scratch<T>(carver, backend, layout, channels_last);
  const bool transposes = channels_last && transposes_whole_input(backend, layout);
  const bool gathers_chunks = channels_last && !transposes;
  // The input in logical order, where it is read whole.
  const T* logical = input;
  if (transposes) {
    transpose_channels_last(backend, *channels_last, input, reordered.whole);
    logical = reordered.whole;
  }

  if (layout.channel_granularity) {
    std::uint32_t* list = layout.encoding == position_encoding::channel_list
                              ? static_cast<std::uint32_t*>(out.positions)
                              : scratch.channel_list;
    select_channels(backend, layout, logical, scratch.scores, scratch.order, list);
    const std::int64_t kept = layout.kept_channels, inner = layout.inner;
    // copy_n, not memcpy: with inner == 0 both buffers may be null, which memcpy does not allow.
    parallel_for(backend, layout.outer, [&](std::int64_t o, int) {
      for (std::int64_t j = 0; j < kept; ++j)
        std::copy_n(logical + (o * layout.channels + list[j]) * inner, inner,
                    out.values + (o * kept + j) * inner);
    });
    return;
  }
  if (selects_shared_chunk(backend, layout)) {
    compress_shared_chunk(backend, layout, logical, out, scratch.keys, scratch.shared);
    return;
  }
  for_each_chunk(backend, layout, [&](std::int64_t chunk, int thread) {
    const T* data = logical + layout.chunk_begin(chunk);
    if (gathers_chunks) {
      T* gathered = reordered.chunks + thread * reordered.chunk_elements;
      gather_channels_last(*channels_last, input, layout.chunk_begin(chunk),
                           layout.chunk_length(chunk), gathered);
      data = gathered;
    }
    compress_chunk(layout, data, chunk, out, scratch.keys + thread * scratch.keys_per_thread);
  });
}

template <storage_type T>
std::size_t densify_workspace_bytes(const cpu_backend& backend, const cache_layout& layout) {
  workspace_carver carver;
  add_read_scratch(carver, backend, layout, false);
  return carver.bytes();
}

template <storage_type T>
void densify(const cpu_backend& backend, const cache_view<const T>& cache, T* out,
             workspace memory) {
  const cache_layout& layout = cache.layout;
  workspace_carver carver(memory);
  const read_scratch scratch = add_read_scratch(carver, backend, layout, false);

  // Each work item zeroes its positions, then writes its kept values while they are in cache.
  const auto zero = [&](std::int64_t first, std::int64_t count) {
    std::fill_n(out + first, count, T{});
  };
  if (!layout.rescale) {
    for_each_kept(backend, cache, scratch, zero, [&](std::int64_t position, std::int64_t value) {
      out[position] = cache.values[value];
    });
    return;
  }
  for_each_kept(backend, cache, scratch, zero, [&](std::int64_t position, std::int64_t value) {
    out[position] = from_float<T>(scaled_value(layout, cache.values[value], position));
  });
}

}  // namespace dropit::detail::cpu
