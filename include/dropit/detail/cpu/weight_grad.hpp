#pragma once
// Weight gradients from a cache on the CPU. The cache is decoded once into sorted
// (position, value) entries; each kernel then does work proportional to the kept count, and every
// thread owns a fixed slice of the gradient so results never depend on the thread count.

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "../../cache.hpp"
#include "../../shape.hpp"
#include "../common/geometry.hpp"
#include "../common/workspace.hpp"
#include "cache_ops.hpp"
#include "parallel.hpp"
#include "simd.hpp"

namespace dropit::detail::cpu {

/// Kept elements of a cache in ascending flat position, values in float and already scaled.
struct sparse_entries {
  std::int64_t* positions = nullptr;
  float* values = nullptr;
  std::int64_t count = 0;

  /// Index of the first entry at or after flat position `position`.
  std::int64_t lower_bound(std::int64_t position) const {
    return std::lower_bound(positions, positions + count, position) - positions;
  }
};

struct decode_scratch {
  sparse_entries entries;
  read_scratch reading;
};

inline decode_scratch add_decode_scratch(workspace_carver& carver, const cpu_backend& backend,
                                         const cache_layout& layout) {
  decode_scratch scratch;
  scratch.entries.count = layout.kept();
  scratch.entries.positions = carver.add<std::int64_t>(layout.kept());
  scratch.entries.values = carver.add<float>(layout.kept());
  scratch.reading = add_read_scratch(carver, backend, layout, false);
  return scratch;
}

template <class T>
void decode(const cpu_backend& backend, const cache_view<T>& cache, const decode_scratch& scratch) {
  const auto nothing_on_entry = [](std::int64_t, std::int64_t) {};
  for_each_kept(backend, cache, scratch.reading, nothing_on_entry,
                [&](std::int64_t position, std::int64_t value) {
                  scratch.entries.positions[value] = position;
                  scratch.entries.values[value] =
                      scaled_value(cache.layout, cache.values[value], position);
                });
}

/// `dz` as float: the caller's buffer for float, a converted copy in `converted` otherwise.
template <storage_type T>
const float* as_float(const cpu_backend& backend, const T* dz, std::int64_t count,
                      float* converted) {
  if constexpr (std::same_as<T, float>) {
    return dz;
  } else {
    constexpr std::int64_t block = 1 << 16;
    parallel_for(backend, (count + block - 1) / block, [&](std::int64_t b, int) {
      const std::int64_t end = std::min(count, (b + 1) * block);
      for (std::int64_t i = b * block; i < end; ++i) converted[i] = to_float(dz[i]);
    });
    return converted;
  }
}

/// Stores `value` into `out` (replacing or adding to it).
template <storage_type T>
inline void store_gradient(T& out, float value, grad_mode mode) {
  out = from_float<T>(mode == grad_mode::accumulate ? to_float(out) + value : value);
}

// ---------------------------------------------------------------------------------------------
// Linear: dW[N_out, K] = dZ[M, N_out]^T A[M, K].
//
// The kept entries arrive sorted by (row m, column i). Each block of `linear_row_block` rows is
// regrouped by column i, so that dW[tile, i] accumulates in registers over the block's entries of
// column i while the block's slice of dZ (row_block x tile floats) stays in L2.

inline constexpr std::int64_t linear_tile = 64;
inline constexpr std::int64_t linear_row_block = 1024;

struct linear_scratch {
  decode_scratch decoded;
  std::int64_t* column_begin = nullptr;  // [blocks][K + 2], see regroup_by_column
  std::uint32_t* column_rows = nullptr;  // [kept] row within its block, column-major per block
  float* column_values = nullptr;        // [kept]
  float* accumulator = nullptr;          // [tiles][K][linear_tile]
  float* packed_dz = nullptr;            // one row block of dZ: [tiles][linear_row_block][tile]
};

inline linear_scratch add_linear_scratch(workspace_carver& carver, const cpu_backend& backend,
                                         const cache_layout& layout, const linear_dims& d) {
  const std::int64_t rows = d.rows, in_features = d.in_features, out_features = d.out_features;
  linear_scratch scratch;
  scratch.decoded = add_decode_scratch(carver, backend, layout);
  const std::int64_t blocks = (rows + linear_row_block - 1) / linear_row_block;
  scratch.column_begin =
      carver.add<std::int64_t>(blocks, checked_add(in_features, std::int64_t{2}, "dW columns"));
  scratch.column_rows = carver.add<std::uint32_t>(layout.kept());
  scratch.column_values = carver.add<float>(layout.kept());
  const std::int64_t tiles = (out_features + linear_tile - 1) / linear_tile;
  scratch.accumulator = carver.add<float>(tiles, in_features, linear_tile);
  scratch.packed_dz = carver.add<float>(tiles, std::min(rows, linear_row_block), linear_tile);
  return scratch;
}

/// Counting sort of one row block's entries by column. Afterwards the entries of column i are
/// [begin[i], begin[i + 1]) (indices into the column arrays), holding their row within the block.
inline void regroup_by_column(const sparse_entries& entries, std::int64_t first_row,
                              std::int64_t end_row, std::int64_t in_features, std::int64_t* begin,
                              std::uint32_t* column_rows, float* column_values) {
  const std::int64_t first = entries.lower_bound(first_row * in_features);
  const std::int64_t last = entries.lower_bound(end_row * in_features);
  std::fill_n(begin, in_features + 2, first);
  // Rows are found by walking, not dividing: entries are sorted by flat position.
  auto for_each_entry = [&](auto&& visit) {
    std::int64_t row = first_row, row_start = first_row * in_features;
    for (std::int64_t e = first; e < last; ++e) {
      while (entries.positions[e] >= row_start + in_features) {
        ++row;
        row_start += in_features;
      }
      visit(e, row - first_row, entries.positions[e] - row_start);
    }
  };
  for_each_entry([&](std::int64_t, std::int64_t, std::int64_t column) { ++begin[column + 2]; });
  for (std::int64_t i = 2; i < in_features + 2; ++i) begin[i] += begin[i - 1] - first;
  for_each_entry([&](std::int64_t e, std::int64_t row, std::int64_t column) {
    const std::int64_t slot = begin[column + 1]++;
    column_rows[slot] = static_cast<std::uint32_t>(row);
    column_values[slot] = entries.values[e];
  });
}

/// acc[0, width) += sum over the column's entries of value * dz[row][0, width).
DROPIT_ALWAYS_INLINE void accumulate_column_kernel(float* acc, const float* dz,
                                                   std::int64_t dz_stride,
                                                   const std::uint32_t* rows, const float* values,
                                                   std::int64_t count, std::int64_t width) {
#if defined(__GNUC__)
  if (width == linear_tile) {
    constexpr int lanes = linear_tile / 8;
    float8 sum[lanes];
    for (int l = 0; l < lanes; ++l) load(sum[l], acc + 8 * l);
    for (std::int64_t e = 0; e < count; ++e) {
      const float* dz_row = dz + rows[e] * dz_stride;
      for (int l = 0; l < lanes; ++l) {
        float8 x;
        load(x, dz_row + 8 * l);
        sum[l] += values[e] * x;
      }
    }
    for (int l = 0; l < lanes; ++l) store(acc + 8 * l, sum[l]);
    return;
  }
#endif
  for (std::int64_t e = 0; e < count; ++e) {
    const float* dz_row = dz + rows[e] * dz_stride;
    for (std::int64_t o = 0; o < width; ++o) acc[o] += values[e] * dz_row[o];
  }
}
DROPIT_CPU_DISPATCH(accumulate_column)

template <storage_type T>
void linear_weight_grad(const cpu_backend& backend, const cache_view<const T>& a, const T* dz,
                        T* dw, const linear_dims& d, grad_mode mode,
                        const linear_scratch& scratch) {
  const std::int64_t rows = d.rows, in_features = d.in_features, out_features = d.out_features;
  decode(backend, a, scratch.decoded);
  const std::int64_t blocks = (rows + linear_row_block - 1) / linear_row_block;
  parallel_for(backend, blocks, [&](std::int64_t b, int) {
    regroup_by_column(scratch.decoded.entries, b * linear_row_block,
                      std::min(rows, (b + 1) * linear_row_block), in_features,
                      scratch.column_begin + b * (in_features + 2), scratch.column_rows,
                      scratch.column_values);
  });

  const std::int64_t tiles = (out_features + linear_tile - 1) / linear_tile;
  const std::int64_t block_capacity = std::min(rows, linear_row_block);
  std::fill_n(scratch.accumulator, tiles * in_features * linear_tile, 0.0f);
  for (std::int64_t b = 0; b < blocks; ++b) {
    // Copy the block's rows of dZ (as float) tile by tile, so that each tile reads a contiguous
    // slice: rows of dZ are often a power of two apart, and strided slices of them would fight
    // over the same few cache sets.
    const std::int64_t first_row = b * linear_row_block;
    const std::int64_t block_rows = std::min(linear_row_block, rows - first_row);
    parallel_for(backend, block_rows, [&](std::int64_t r, int) {
      const T* source = dz + (first_row + r) * out_features;
      for (std::int64_t first = 0; first < out_features; first += linear_tile) {
        float* target =
            scratch.packed_dz + (first / linear_tile * block_capacity + r) * linear_tile;
        const std::int64_t width = std::min(linear_tile, out_features - first);
        for (std::int64_t o = 0; o < width; ++o) target[o] = to_float(source[first + o]);
      }
    });
    const std::int64_t* begin = scratch.column_begin + b * (in_features + 2);
    parallel_for(backend, tiles, [&](std::int64_t tile, int) {
      const std::int64_t width = std::min(linear_tile, out_features - tile * linear_tile);
      const float* packed = scratch.packed_dz + tile * block_capacity * linear_tile;
      float* acc = scratch.accumulator + tile * in_features * linear_tile;
      for (std::int64_t i = 0; i < in_features; ++i) {
        const std::int64_t count = begin[i + 1] - begin[i];
        if (count == 0) continue;
        accumulate_column(acc + i * linear_tile, packed, linear_tile,
                          scratch.column_rows + begin[i], scratch.column_values + begin[i], count,
                          width);
      }
    });
  }
  parallel_for(backend, tiles, [&](std::int64_t tile, int) {
    const std::int64_t first = tile * linear_tile;
    const std::int64_t width = std::min(linear_tile, out_features - first);
    const float* acc = scratch.accumulator + tile * in_features * linear_tile;
    for (std::int64_t o = 0; o < width; ++o)
      for (std::int64_t i = 0; i < in_features; ++i)
        store_gradient(dw[(first + o) * in_features + i], acc[i * linear_tile + o], mode);
  });
}

// ---------------------------------------------------------------------------------------------
// Conv2d.

template <std::int64_t Width>
DROPIT_ALWAYS_INLINE void multiply_add_fixed(float* __restrict acc, const float* __restrict x,
                                             float scale) {
  for (std::int64_t o = 0; o < Width; ++o) acc[o] += scale * x[o];
}

/// acc[0, width) += scale * x[0, width). The common channel counts get fully unrolled loops: the
/// rows are short, and a general loop's set-up would cost as much as its arithmetic.
DROPIT_ALWAYS_INLINE void multiply_add(float* __restrict acc, const float* __restrict x,
                                       float scale, std::int64_t width) {
  switch (width) {
    case 16:
      return multiply_add_fixed<16>(acc, x, scale);
    case 32:
      return multiply_add_fixed<32>(acc, x, scale);
    case 64:
      return multiply_add_fixed<64>(acc, x, scale);
    default:
      for (std::int64_t o = 0; o < width; ++o) acc[o] += scale * x[o];
  }
}

/// Bytes of dZ (as float) that one tile of samples may span in the conv2d weight gradient.
inline constexpr std::int64_t conv2d_dz_tile_bytes = std::int64_t{256} << 10;

struct conv2d_scratch {
  decode_scratch decoded;
  float* dz = nullptr;           // [N][H_out][W_out][C_out]: the C_out run of a pixel contiguous
  float* accumulator = nullptr;  // [C_in][KH][KW][C_out / groups]
  // Output row (column) that input row h (column w) meets through tap kh (kw), or -1: looked up,
  // because dividing by the stride for every kept element and tap would cost more than the
  // multiply-adds.
  std::int32_t* out_rows = nullptr;  // [H][KH]
  std::int32_t* out_cols = nullptr;  // [W][KW]
};

inline conv2d_scratch add_conv2d_scratch(workspace_carver& carver, const cpu_backend& backend,
                                         const cache_layout& layout, const conv2d_geometry& g) {
  conv2d_scratch scratch;
  scratch.decoded = add_decode_scratch(carver, backend, layout);
  scratch.dz = carver.add<float>(g.batch, g.out_height, g.out_width, g.out_channels);
  scratch.accumulator = carver.add<float>(g.in_channels, g.kernel_h, g.kernel_w, g.out_per_group());
  scratch.out_rows = carver.add<std::int32_t>(g.height, g.kernel_h);
  scratch.out_cols = carver.add<std::int32_t>(g.width, g.kernel_w);
  return scratch;
}

/// Output coordinate that input coordinate `x` meets through kernel tap `tap`, or -1.
inline std::int64_t conv_output_index(std::int64_t x, std::int64_t tap, std::int64_t stride,
                                      std::int64_t pad, std::int64_t dilation,
                                      std::int64_t out_extent) {
  const std::int64_t shifted = x + pad - tap * dilation;
  if (shifted < 0 || shifted % stride != 0) return -1;
  const std::int64_t out = shifted / stride;
  return out < out_extent ? out : -1;
}

/// The weight-gradient rows of input channel `c` over samples [first_sample, end_sample): every
/// kept element of the channel meets, through each kernel tap, one output pixel whose C_out/groups
/// gradients it scales into the accumulator.
DROPIT_ALWAYS_INLINE void accumulate_conv_channel_kernel(const conv2d_geometry* geometry,
                                                         const sparse_entries* kept,
                                                         const conv2d_scratch* scratch,
                                                         std::int64_t c, std::int64_t first_sample,
                                                         std::int64_t end_sample) {
  const conv2d_geometry& g = *geometry;
  const sparse_entries& entries = *kept;
  const std::int64_t taps = g.kernel_h * g.kernel_w;
  const std::int64_t group_out = g.out_per_group();
  const std::int64_t plane_size = g.height * g.width;
  float* acc = scratch->accumulator + c * taps * group_out;
  const float* dz = scratch->dz + c / g.in_per_group() * group_out;
  for (std::int64_t n = first_sample; n < end_sample; ++n) {
    const std::int64_t base = (n * g.in_channels + c) * plane_size;
    const std::int64_t end = entries.lower_bound(base + plane_size);
    std::int64_t h = 0, row_start = base;  // entries ascend: walk the rows instead of dividing
    for (std::int64_t e = entries.lower_bound(base); e < end; ++e) {
      while (entries.positions[e] >= row_start + g.width) {
        ++h;
        row_start += g.width;
      }
      const std::int32_t* rows = scratch->out_rows + h * g.kernel_h;
      const std::int32_t* cols =
          scratch->out_cols + (entries.positions[e] - row_start) * g.kernel_w;
      const float value = entries.values[e];
      for (std::int64_t kh = 0; kh < g.kernel_h; ++kh) {
        if (rows[kh] < 0) continue;
        const float* dz_row = dz + (n * g.out_height + rows[kh]) * g.out_width * g.out_channels;
        for (std::int64_t kw = 0; kw < g.kernel_w; ++kw) {
          if (cols[kw] < 0) continue;
          multiply_add(acc + (kh * g.kernel_w + kw) * group_out, dz_row + cols[kw] * g.out_channels,
                       value, group_out);
        }
      }
    }
  }
}
DROPIT_CPU_DISPATCH(accumulate_conv_channel)

template <storage_type T>
void conv2d_weight_grad(const cpu_backend& backend, const cache_view<const T>& x, const T* dz,
                        T* dw, const conv2d_geometry& g, grad_mode mode,
                        const conv2d_scratch& scratch) {
  decode(backend, x, scratch.decoded);
  const sparse_entries& entries = scratch.decoded.entries;
  const std::int64_t out_pixels = g.out_height * g.out_width;
  // dZ to [N][pixel][C_out], in blocks of pixels whose strided writes (16 KiB) stay in L1 while
  // each plane is read in runs long enough for the hardware prefetcher to follow.
  const std::int64_t pixel_block = std::max<std::int64_t>(8, 4096 / g.out_channels);
  const std::int64_t pixel_blocks = (out_pixels + pixel_block - 1) / pixel_block;
  parallel_for(backend, g.batch * pixel_blocks, [&](std::int64_t item, int) {
    const std::int64_t n = item / pixel_blocks;
    const std::int64_t first = item % pixel_blocks * pixel_block;
    const std::int64_t last = std::min(out_pixels, first + pixel_block);
    float* target = scratch.dz + n * out_pixels * g.out_channels;
    for (std::int64_t co = 0; co < g.out_channels; ++co) {
      const T* plane = dz + (n * g.out_channels + co) * out_pixels;
      for (std::int64_t p = first; p < last; ++p)
        target[p * g.out_channels + co] = to_float(plane[p]);
    }
  });

  const std::int64_t taps = g.kernel_h * g.kernel_w;
  const std::int64_t group_out = g.out_per_group();
  for (std::int64_t h = 0; h < g.height; ++h)
    for (std::int64_t kh = 0; kh < g.kernel_h; ++kh)
      scratch.out_rows[h * g.kernel_h + kh] = static_cast<std::int32_t>(
          conv_output_index(h, kh, g.stride_h, g.pad_h, g.dilation_h, g.out_height));
  for (std::int64_t w = 0; w < g.width; ++w)
    for (std::int64_t kw = 0; kw < g.kernel_w; ++kw)
      scratch.out_cols[w * g.kernel_w + kw] = static_cast<std::int32_t>(
          conv_output_index(w, kw, g.stride_w, g.pad_w, g.dilation_w, g.out_width));
  // Each thread takes a range of input channels and walks the batch in tiles of samples whose dZ
  // fits in its L2, doing every channel of the range on a tile before the next: walking the whole
  // batch per channel would stream all of dZ from memory once per input channel.
  std::fill_n(scratch.accumulator, g.in_channels * taps * group_out, 0.0f);
  const std::int64_t sample_bytes = out_pixels * g.out_channels * std::int64_t{sizeof(float)};
  const std::int64_t tile = std::max<std::int64_t>(1, conv2d_dz_tile_bytes / sample_bytes);
  const std::int64_t ranges = std::min<std::int64_t>(backend.thread_count(), g.in_channels);
  parallel_for(backend, ranges, [&](std::int64_t range, int) {
    const std::int64_t first_channel = range * g.in_channels / ranges;
    const std::int64_t end_channel = (range + 1) * g.in_channels / ranges;
    for (std::int64_t n = 0; n < g.batch; n += tile)
      for (std::int64_t c = first_channel; c < end_channel; ++c)
        accumulate_conv_channel(&g, &entries, &scratch, c, n, std::min(g.batch, n + tile));
  });

  const std::int64_t group_in = g.in_per_group();
  parallel_for(backend, g.out_channels, [&](std::int64_t co, int) {
    const std::int64_t first_in = co / group_out * group_in;
    const std::int64_t co_in_group = co % group_out;
    for (std::int64_t ci = 0; ci < group_in; ++ci)
      for (std::int64_t t = 0; t < taps; ++t)
        store_gradient(dw[(co * group_in + ci) * taps + t],
                       scratch.accumulator[((first_in + ci) * taps + t) * group_out + co_in_group],
                       mode);
  });
}

}  // namespace dropit::detail::cpu
