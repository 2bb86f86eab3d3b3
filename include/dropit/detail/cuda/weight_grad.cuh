#pragma once
// CUDA weight gradients: densify the cache into a transient workspace, then a dense GEMM.
// - linear: densify into the input's own type, then cuBLAS (gemm_linear_weight_grad, float
//   accumulation). A 16-bit dW += goes through a float workspace and is stored once: cuBLAS's
//   16-bit epilogue rounds the product before adding it (measured on an H200). A 16-bit cache with
//   n/k rescaling is the exception: its gradient uses the unrounded product n/k * value (as the CPU
//   backend does), which a 16-bit densify would round, so it densifies into float and runs the
//   16x16-tiled kernel of kernels.cuh.
// - conv2d: densify into the input's own type, then cuDNN's backward-filter convolution straight
//   into dW (cudnn.cuh: built with cuDNN, the backend's use_cudnn set, and where an engine runs the
//   geometry; dW += blends with beta 1 in cuDNN's float compute type). Otherwise im2col + cuBLAS
//   over blocks of samples: each block's columns and dZ rows go to one strided-batched GEMM (a
//   GEMM per group) that accumulates into a float dW, stored into dW once at the end (rounded
//   once, as on the CPU). Blocks hold as many samples as fit in the size of the dense input, so
//   the transient workspace stays within twice the dense activation (plus one sample's block when
//   a single sample is larger). 16-bit caches with rescaling densify into float and keep the
//   direct kernel, as linear does.
// Float GEMMs and convolutions run on TF32 tensor cores only where the backend allows TF32.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "../../cache.hpp"
#include "../common/geometry.hpp"
#include "cache_ops.cuh"
#include "common.cuh"
#include "cublas.cuh"
#include "kernels.cuh"
#if DROPIT_CUDA_CUDNN
#include "cudnn.cuh"
#endif

namespace dropit::detail::cuda {

struct gradient_scratch {
  void* dense = nullptr;  // the densified input, [numel] of T (cuBLAS) or of float
  densify_scratch reading;
  std::byte* cublas_workspace = nullptr;  // cuBLAS only
  float* dw_sum = nullptr;                // cuBLAS, 16-bit dW +=: [numel of dW]
};

/// Whether the linear weight gradient of a `T` cache of `layout` goes through cuBLAS.
template <storage_type T>
bool linear_uses_cublas(const cache_layout& layout) {
  return std::is_same_v<T, float> || !layout.rescale;
}

template <storage_type T>
gradient_scratch add_linear_scratch(workspace_carver& carver, const cache_layout& layout,
                                    const linear_dims& d) {
  gradient_scratch s;
  const auto n = static_cast<std::size_t>(layout.numel());
  if (linear_uses_cublas<T>(layout)) {
    s.dense = carver.add<T>(n);
    s.cublas_workspace = add_cublas_workspace(carver);
    if (!std::is_same_v<T, float>) s.dw_sum = carver.add<float>(d.out_features, d.in_features);
  } else {
    s.dense = carver.add<float>(n);
  }
  s.reading = add_densify_scratch(carver, layout);
  return s;
}

/// Samples per im2col block of the cuBLAS conv2d weight gradient: as many as keep the block's
/// columns and dZ rows within the element count of the dense input, and at least one.
inline std::int64_t conv2d_block_samples(const conv2d_geometry& g) {
  const std::int64_t pixels = checked_mul(g.out_height, g.out_width, "conv2d output pixels");
  const std::int64_t rows = checked_add(
      checked_mul(g.in_channels, g.kernel_h * g.kernel_w, "conv2d im2col rows"), g.out_channels,
      "conv2d im2col rows");
  const std::int64_t per_sample = checked_mul(pixels, rows, "conv2d im2col block");
  const std::int64_t input = g.batch * g.in_channels * g.height * g.width;
  return std::clamp<std::int64_t>(per_sample == 0 ? g.batch : input / per_sample, 1,
                                  std::max<std::int64_t>(g.batch, 1));
}

struct conv2d_scratch {
  gradient_scratch gradient;
  void* columns = nullptr;  // [C_in * KH * KW, samples * P] of T
  void* dz_rows = nullptr;  // [C_out, samples * P] of T
  float* dw_sum = nullptr;  // [numel of dW]
  std::int64_t block_samples = 0;
#if DROPIT_CUDA_CUDNN
  const cudnn_wgrad_plans* cudnn = nullptr;  // null: the im2col path
  std::byte* cudnn_workspace = nullptr;
#endif
};

template <storage_type T>
bool conv2d_uses_cublas(const cache_layout& layout) {
  return linear_uses_cublas<T>(layout);
}

template <storage_type T>
conv2d_scratch add_conv2d_scratch(workspace_carver& carver, const cache_layout& layout,
                                  const conv2d_geometry& g, bool allow_tf32, bool use_cudnn) {
  conv2d_scratch s;
  const auto n = static_cast<std::size_t>(layout.numel());
  if (!conv2d_uses_cublas<T>(layout)) {
    s.gradient.dense = carver.add<float>(n);
    s.gradient.reading = add_densify_scratch(carver, layout);
    return s;
  }
  const std::int64_t outputs = g.out_channels * g.in_per_group() * g.kernel_h * g.kernel_w;
#if DROPIT_CUDA_CUDNN
  if (use_cudnn && g.batch > 0 && g.out_height * g.out_width > 0 && outputs > 0) {
    s.cudnn = cudnn_wgrad_plans_for<T>(g, allow_tf32);
    if (s.cudnn != nullptr) {
      s.gradient.dense = carver.add<T>(n);
      s.gradient.reading = add_densify_scratch(carver, layout);
      s.cudnn_workspace = carver.add<std::byte>(s.cudnn->workspace_bytes);
      return s;
    }
  }
#else
  static_cast<void>(allow_tf32);
  static_cast<void>(use_cudnn);
#endif
  s.block_samples = conv2d_block_samples(g);
  const std::int64_t block_pixels = s.block_samples * g.out_height * g.out_width;
  s.gradient.dense = carver.add<T>(n);
  s.gradient.reading = add_densify_scratch(carver, layout);
  s.gradient.cublas_workspace = add_cublas_workspace(carver);
  s.columns = carver.add<T>(g.in_channels * g.kernel_h * g.kernel_w, block_pixels);
  s.dz_rows = carver.add<T>(g.out_channels, block_pixels);
  s.dw_sum = carver.add<float>(outputs);
  return s;
}

template <storage_type T>
void linear_weight_grad(cudaStream_t stream, const cache_view<const T>& a, const T* dz, T* dw,
                        const linear_dims& d, grad_mode mode, bool allow_tf32,
                        const gradient_scratch& scratch) {
  if (d.in_features == 0 || d.out_features == 0) return;  // dW is empty
  if (linear_uses_cublas<T>(a.layout)) {
    T* dense = static_cast<T*>(scratch.dense);
    densify<T, T>(stream, a, dense, scratch.reading);
    if (std::is_same_v<T, float> || mode == grad_mode::overwrite) {
      gemm_linear_weight_grad<T>(stream, dense, dz, dw, d, mode == grad_mode::accumulate,
                                 allow_tf32, scratch.cublas_workspace);
    } else {
      const std::int64_t outputs = d.out_features * d.in_features;
      gemm_linear_weight_grad<T>(stream, dense, dz, scratch.dw_sum, d, false, allow_tf32,
                                 scratch.cublas_workspace);
      launch(store_gradient_kernel<T>, {grid_for(outputs)}, stream, scratch.dw_sum, dw, outputs,
             mode);
      check_launch("dropit store_gradient_kernel");
    }
    return;
  }
  float* dense = static_cast<float*>(scratch.dense);
  densify<T, float>(stream, a, dense, scratch.reading);
  const std::int64_t tiles = ((d.in_features + gemm_tile - 1) / gemm_tile) *
                             ((d.out_features + gemm_tile - 1) / gemm_tile);
  launch(linear_weight_grad_kernel<T>, {grid_for(tiles, 1)}, stream, dense, dz, dw, d.rows,
         d.in_features, d.out_features, mode);
  check_launch("dropit linear_weight_grad_kernel");
}

template <storage_type T>
void conv2d_weight_grad(cudaStream_t stream, const cache_view<const T>& x, const T* dz, T* dw,
                        const conv2d_geometry& g, grad_mode mode, bool allow_tf32,
                        const conv2d_scratch& scratch) {
  const std::int64_t outputs = g.out_channels * g.in_per_group() * g.kernel_h * g.kernel_w;
  if (outputs == 0) return;
  if (!conv2d_uses_cublas<T>(x.layout)) {
    float* dense = static_cast<float*>(scratch.gradient.dense);
    densify<T, float>(stream, x, dense, scratch.gradient.reading);
    launch(conv2d_weight_grad_kernel<T>, {grid_for(outputs, 1)}, stream, g, dense, dz, dw, mode);
    check_launch("dropit conv2d_weight_grad_kernel");
    return;
  }
  T* dense = static_cast<T*>(scratch.gradient.dense);
  T* columns = static_cast<T*>(scratch.columns);
  T* dz_rows = static_cast<T*>(scratch.dz_rows);
  densify<T, T>(stream, x, dense, scratch.gradient.reading);
#if DROPIT_CUDA_CUDNN
  if (scratch.cudnn != nullptr) {
    run_cudnn_wgrad(stream, scratch.cudnn->for_call(dz, dw, mode == grad_mode::accumulate), dense,
                    dz, dw, scratch.cudnn_workspace);
    return;
  }
#endif
  const std::int64_t pixels = g.out_height * g.out_width;
  if (g.batch == 0 || pixels == 0)  // nothing to sum: dW = 0 (or unchanged)
    check(cudaMemsetAsync(scratch.dw_sum, 0, static_cast<std::size_t>(outputs) * sizeof(float),
                          stream),
          "conv2d_weight_grad");
  for (std::int64_t first = 0; first < g.batch && pixels > 0; first += scratch.block_samples) {
    const std::int64_t samples = std::min(scratch.block_samples, g.batch - first);
    const std::int64_t column_items =
        g.in_channels * g.kernel_h * g.kernel_w * samples * pixels;
    launch(conv2d_columns_kernel<T>, {grid_for_walk(column_items)}, stream, g, dense, first,
           samples, columns);
    check_launch("dropit conv2d_columns_kernel");
    launch(conv2d_dz_rows_kernel<T>, {grid_for_walk(g.out_channels * samples * pixels)}, stream, g,
           dz, first, samples, dz_rows);
    check_launch("dropit conv2d_dz_rows_kernel");
    gemm_conv2d_weight_grad<T>(stream, columns, dz_rows, scratch.dw_sum, g, samples, first > 0,
                               allow_tf32, scratch.gradient.cublas_workspace);
  }
  launch(store_gradient_kernel<T>, {grid_for(outputs)}, stream, scratch.dw_sum, dw, outputs, mode);
  check_launch("dropit store_gradient_kernel");
}

}  // namespace dropit::detail::cuda
