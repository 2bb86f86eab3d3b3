#pragma once
// Weight gradients from a cache on the CPU. The cache is decoded once into sorted
// (position, value) entries; each kernel then does work proportional to the kept count, and every
// thread owns a fixed slice of the gradient so results never depend on the thread count.

#include <algorithm>
#include <cstdint>

#include "../../cache.hpp"
#include "../../shape.hpp"
#include "cache_ops.hpp"
#include "parallel.hpp"

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
  scratch.entries.positions = carver.add<std::int64_t>(static_cast<std::size_t>(layout.kept()));
  scratch.entries.values = carver.add<float>(static_cast<std::size_t>(layout.kept()));
  scratch.reading = add_read_scratch(carver, backend, layout, false);
  return scratch;
}

template <class T>
void decode(const cpu_backend& backend, const cache_view<T>& cache, const decode_scratch& scratch) {
  const cache_layout& layout = cache.layout;
  const std::int64_t chunk_size = std::max<std::int64_t>(1, layout.chunk_size);
  for_each_kept(backend, cache, scratch.reading, [&](std::int64_t position, std::int64_t value) {
    scratch.entries.positions[value] = position;
    scratch.entries.values[value] =
        to_float(cache.values[value]) * layout.value_scale(position / chunk_size);
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

/// Output columns per tile: a tile's accumulator (K x 64 floats) stays in L2 while the kept
/// entries stream past, and each entry is one contiguous 64-wide multiply-add.
inline constexpr std::int64_t linear_tile = 64;

struct linear_scratch {
  decode_scratch decoded;
  std::int64_t* row_begin = nullptr;  // M + 1 entry indices
  float* dz = nullptr;                // converted dZ (16-bit types only)
  float* accumulator = nullptr;       // [tiles][K][linear_tile]
};

template <storage_type T>
linear_scratch add_linear_scratch(workspace_carver& carver, const cpu_backend& backend,
                                  const cache_layout& layout, std::int64_t rows,
                                  std::int64_t in_features, std::int64_t out_features) {
  linear_scratch scratch;
  scratch.decoded = add_decode_scratch(carver, backend, layout);
  scratch.row_begin = carver.add<std::int64_t>(static_cast<std::size_t>(rows + 1));
  if constexpr (!std::same_as<T, float>)
    scratch.dz = carver.add<float>(static_cast<std::size_t>(rows * out_features));
  const std::int64_t tiles = (out_features + linear_tile - 1) / linear_tile;
  scratch.accumulator =
      carver.add<float>(static_cast<std::size_t>(tiles * in_features * linear_tile));
  return scratch;
}

template <std::int64_t Width>
inline void multiply_add(float* __restrict acc, const float* __restrict x, float scale,
                         std::int64_t width) {
  if constexpr (Width > 0) {
#pragma GCC ivdep
    for (std::int64_t o = 0; o < Width; ++o) acc[o] += scale * x[o];
  } else {
    for (std::int64_t o = 0; o < width; ++o) acc[o] += scale * x[o];
  }
}

template <storage_type T>
void linear_weight_grad(const cpu_backend& backend, const cache_view<const T>& a, const T* dz,
                        T* dw, std::int64_t rows, std::int64_t in_features,
                        std::int64_t out_features, grad_mode mode, const linear_scratch& scratch) {
  decode(backend, a, scratch.decoded);
  const sparse_entries& entries = scratch.decoded.entries;
  parallel_for(backend, rows + 1, [&](std::int64_t m, int) {
    scratch.row_begin[m] = entries.lower_bound(m * in_features);
  });
  const float* dz_float = as_float(backend, dz, rows * out_features, scratch.dz);

  const std::int64_t tiles = (out_features + linear_tile - 1) / linear_tile;
  parallel_for(backend, tiles, [&](std::int64_t tile, int) {
    const std::int64_t first = tile * linear_tile;
    const std::int64_t width = std::min(linear_tile, out_features - first);
    float* acc = scratch.accumulator + tile * in_features * linear_tile;
    std::fill_n(acc, in_features * linear_tile, 0.0f);
    for (std::int64_t m = 0; m < rows; ++m) {
      const float* dz_row = dz_float + m * out_features + first;
      const std::int64_t row_start = m * in_features;
      for (std::int64_t e = scratch.row_begin[m]; e < scratch.row_begin[m + 1]; ++e) {
        float* acc_row = acc + (entries.positions[e] - row_start) * linear_tile;
        if (width == linear_tile)
          multiply_add<linear_tile>(acc_row, dz_row, entries.values[e], width);
        else
          multiply_add<0>(acc_row, dz_row, entries.values[e], width);
      }
    }
    for (std::int64_t o = 0; o < width; ++o)
      for (std::int64_t i = 0; i < in_features; ++i)
        store_gradient(dw[(first + o) * in_features + i], acc[i * linear_tile + o], mode);
  });
}

// ---------------------------------------------------------------------------------------------
// Conv2d.

struct conv2d_geometry {
  std::int64_t batch, in_channels, height, width;
  std::int64_t out_channels, out_height, out_width;
  std::int64_t kernel_h, kernel_w;
  std::int64_t stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w, groups;

  std::int64_t in_per_group() const { return in_channels / groups; }
  std::int64_t out_per_group() const { return out_channels / groups; }
};

struct conv2d_scratch {
  decode_scratch decoded;
  float* dz = nullptr;           // [N][H_out][W_out][C_out]: the C_out run of a pixel contiguous
  float* accumulator = nullptr;  // [C_in][KH][KW][C_out / groups]
};

inline conv2d_scratch add_conv2d_scratch(workspace_carver& carver, const cpu_backend& backend,
                                         const cache_layout& layout, const conv2d_geometry& g) {
  conv2d_scratch scratch;
  scratch.decoded = add_decode_scratch(carver, backend, layout);
  scratch.dz = carver.add<float>(
      static_cast<std::size_t>(g.batch * g.out_height * g.out_width * g.out_channels));
  scratch.accumulator = carver.add<float>(
      static_cast<std::size_t>(g.in_channels * g.kernel_h * g.kernel_w * g.out_per_group()));
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

template <storage_type T>
void conv2d_weight_grad(const cpu_backend& backend, const cache_view<const T>& x, const T* dz,
                        T* dw, const conv2d_geometry& g, grad_mode mode,
                        const conv2d_scratch& scratch) {
  decode(backend, x, scratch.decoded);
  const sparse_entries& entries = scratch.decoded.entries;
  const std::int64_t out_pixels = g.out_height * g.out_width;
  parallel_for(backend, g.batch, [&](std::int64_t n, int) {
    for (std::int64_t co = 0; co < g.out_channels; ++co) {
      const T* plane = dz + (n * g.out_channels + co) * out_pixels;
      float* column = scratch.dz + n * out_pixels * g.out_channels + co;
      for (std::int64_t p = 0; p < out_pixels; ++p) column[p * g.out_channels] = to_float(plane[p]);
    }
  });

  const std::int64_t taps = g.kernel_h * g.kernel_w;
  const std::int64_t group_out = g.out_per_group();
  const std::int64_t plane_size = g.height * g.width;
  parallel_for(backend, g.in_channels, [&](std::int64_t c, int) {
    float* acc = scratch.accumulator + c * taps * group_out;
    std::fill_n(acc, taps * group_out, 0.0f);
    const std::int64_t group_first_out = c / g.in_per_group() * group_out;
    for (std::int64_t n = 0; n < g.batch; ++n) {
      const std::int64_t base = (n * g.in_channels + c) * plane_size;
      const std::int64_t end = entries.lower_bound(base + plane_size);
      for (std::int64_t e = entries.lower_bound(base); e < end; ++e) {
        const std::int64_t offset = entries.positions[e] - base;
        const std::int64_t h = offset / g.width, w = offset % g.width;
        const float value = entries.values[e];
        for (std::int64_t kh = 0; kh < g.kernel_h; ++kh) {
          const std::int64_t oh =
              conv_output_index(h, kh, g.stride_h, g.pad_h, g.dilation_h, g.out_height);
          if (oh < 0) continue;
          for (std::int64_t kw = 0; kw < g.kernel_w; ++kw) {
            const std::int64_t ow =
                conv_output_index(w, kw, g.stride_w, g.pad_w, g.dilation_w, g.out_width);
            if (ow < 0) continue;
            const float* dz_pixel = scratch.dz +
                                    ((n * g.out_height + oh) * g.out_width + ow) * g.out_channels +
                                    group_first_out;
            multiply_add<0>(acc + (kh * g.kernel_w + kw) * group_out, dz_pixel, value, group_out);
          }
        }
      }
    }
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
