#pragma once
// CUDA weight gradients: densify the cache into a transient workspace, then a dense GEMM.
// - linear: densify into the input's own type, then cuBLAS (gemm_linear_weight_grad, float
//   accumulation). A 16-bit cache with n/k rescaling is the exception: its gradient uses the
//   unrounded product n/k * value (as the CPU backend does), which a 16-bit densify would round, so
//   it densifies into float and runs the 16x16-tiled kernel of kernels.cuh.
// - conv2d: densify into float, then one block per dW element (first version; cuDNN's backward
//   filter is what the LibTorch adapters use on the GPU).

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "../../cache.hpp"
#include "../common/geometry.hpp"
#include "cache_ops.cuh"
#include "common.cuh"
#include "cublas.cuh"
#include "kernels.cuh"

namespace dropit::detail::cuda {

struct gradient_scratch {
  void* dense = nullptr;  // the densified input, [numel] of T (cuBLAS) or of float
  densify_scratch reading;
  std::byte* cublas_workspace = nullptr;  // cuBLAS only
};

/// Whether the linear weight gradient of a `T` cache of `layout` goes through cuBLAS.
template <storage_type T>
bool linear_uses_cublas(const cache_layout& layout) {
  return std::is_same_v<T, float> || !layout.rescale;
}

template <storage_type T>
gradient_scratch add_linear_scratch(workspace_carver& carver, const cache_layout& layout) {
  gradient_scratch s;
  const auto n = static_cast<std::size_t>(layout.numel());
  if (linear_uses_cublas<T>(layout)) {
    s.dense = carver.add<T>(n);
    s.cublas_workspace = add_cublas_workspace(carver);
  } else {
    s.dense = carver.add<float>(n);
  }
  s.reading = add_densify_scratch(carver, layout);
  return s;
}

inline gradient_scratch add_conv2d_scratch(workspace_carver& carver, const cache_layout& layout) {
  gradient_scratch s;
  s.dense = carver.add<float>(static_cast<std::size_t>(layout.numel()));
  s.reading = add_densify_scratch(carver, layout);
  return s;
}

template <storage_type T>
void linear_weight_grad(cudaStream_t stream, const cache_view<const T>& a, const T* dz, T* dw,
                        const linear_dims& d, grad_mode mode, const gradient_scratch& scratch) {
  if (d.in_features == 0 || d.out_features == 0) return;  // dW is empty
  if (linear_uses_cublas<T>(a.layout)) {
    T* dense = static_cast<T*>(scratch.dense);
    densify<T, T>(stream, a, dense, scratch.reading);
    gemm_linear_weight_grad<T>(stream, dense, dz, dw, d, mode, scratch.cublas_workspace);
    return;
  }
  float* dense = static_cast<float*>(scratch.dense);
  densify<T, float>(stream, a, dense, scratch.reading);
  const std::int64_t tiles = ((d.in_features + gemm_tile - 1) / gemm_tile) *
                             ((d.out_features + gemm_tile - 1) / gemm_tile);
  linear_weight_grad_kernel<T><<<grid_for(tiles, 1), block_threads, 0, stream>>>(
      dense, dz, dw, d.rows, d.in_features, d.out_features, mode);
  check_launch("dropit linear_weight_grad_kernel");
}

template <storage_type T>
void conv2d_weight_grad(cudaStream_t stream, const cache_view<const T>& x, const T* dz, T* dw,
                        const conv2d_geometry& g, grad_mode mode, const gradient_scratch& scratch) {
  const std::int64_t outputs =
      g.out_channels * (g.in_channels / g.groups) * g.kernel_h * g.kernel_w;
  if (outputs == 0) return;
  float* dense = static_cast<float*>(scratch.dense);
  densify<T, float>(stream, x, dense, scratch.reading);
  conv2d_weight_grad_kernel<T>
      <<<grid_for(outputs, 1), block_threads, 0, stream>>>(g, dense, dz, dw, mode);
  check_launch("dropit conv2d_weight_grad_kernel");
}

}  // namespace dropit::detail::cuda
