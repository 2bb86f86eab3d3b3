#pragma once
// CUDA weight gradients. First version: densify the cache into a float workspace (kept values
// scaled in float, as the CPU backend's decode does), then a dense kernel: a 16x16-tiled
// dW = dZ^T A for linear, one block per dW element for conv2d. Work is that of the dense gradient
// whatever gamma is; the direct sparse kernels and cuBLAS come with the GPU measurements.

#include <cstddef>
#include <cstdint>

#include "../../cache.hpp"
#include "../common/geometry.hpp"
#include "cache_ops.cuh"
#include "common.cuh"
#include "kernels.cuh"

namespace dropit::detail::cuda {

struct gradient_scratch {
  float* dense = nullptr;  // the densified input, [numel]
  densify_scratch reading;
};

inline gradient_scratch add_gradient_scratch(workspace_carver& carver, const cache_layout& layout) {
  gradient_scratch s;
  s.dense = carver.add<float>(static_cast<std::size_t>(layout.numel()));
  s.reading = add_densify_scratch(carver, layout);
  return s;
}

template <storage_type T>
void linear_weight_grad(cudaStream_t stream, const cache_view<const T>& a, const T* dz, T* dw,
                        const linear_dims& d, grad_mode mode, const gradient_scratch& scratch) {
  const std::int64_t rows = d.rows, in_features = d.in_features, out_features = d.out_features;
  if (in_features == 0 || out_features == 0) return;  // dW is empty
  densify(stream, a, scratch.dense, scratch.reading);
  const std::int64_t tiles =
      ((in_features + gemm_tile - 1) / gemm_tile) * ((out_features + gemm_tile - 1) / gemm_tile);
  linear_weight_grad_kernel<T><<<grid_for(tiles, 1), block_threads, 0, stream>>>(
      scratch.dense, dz, dw, rows, in_features, out_features, mode);
  check_launch("dropit linear_weight_grad_kernel");
}

template <storage_type T>
void conv2d_weight_grad(cudaStream_t stream, const cache_view<const T>& x, const T* dz, T* dw,
                        const conv2d_geometry& g, grad_mode mode, const gradient_scratch& scratch) {
  const std::int64_t outputs =
      g.out_channels * (g.in_channels / g.groups) * g.kernel_h * g.kernel_w;
  if (outputs == 0) return;
  densify(stream, x, scratch.dense, scratch.reading);
  conv2d_weight_grad_kernel<T>
      <<<grid_for(outputs, 1), block_threads, 0, stream>>>(g, scratch.dense, dz, dw, mode);
  check_launch("dropit conv2d_weight_grad_kernel");
}

}  // namespace dropit::detail::cuda
