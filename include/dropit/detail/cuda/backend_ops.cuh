#pragma once
// The definitions of the CUDA backend's operations declared in cuda.hpp: the public entry points
// have checked every operand, so these carve the workspace and enqueue the kernels on the
// backend's stream.

#include <cstddef>
#include <cstdint>

#include "../../cuda.hpp"
#include "../common/workspace.hpp"
#include "cache_ops.cuh"
#include "common.cuh"
#include "weight_grad.cuh"

namespace dropit::detail {

template <storage_type T>
std::size_t backend_ops<cuda_backend>::compress_workspace_bytes(
    const cuda_backend&, const cache_layout& layout,
    const std::optional<channels_last_dims>& channels_last) {
  return workspace_bytes_of([&](workspace_carver& carver) {
    cuda::add_compress_scratch<T>(carver, layout, channels_last);
  });
}

template <storage_type T>
void backend_ops<cuda_backend>::compress(const cuda_backend& backend, const T* input,
                                         const std::optional<channels_last_dims>& channels_last,
                                         const cache_view<T>& out, workspace memory) {
  cuda::expect_no_pending_error("compress");
  cuda::compress(backend.stream, input, channels_last, out, memory);
}

template <storage_type T>
std::size_t backend_ops<cuda_backend>::densify_workspace_bytes(const cuda_backend&,
                                                               const cache_layout& layout) {
  return workspace_bytes_of(
      [&](workspace_carver& carver) { cuda::add_densify_scratch(carver, layout); });
}

template <storage_type T>
void backend_ops<cuda_backend>::densify(const cuda_backend& backend,
                                        const cache_view<const T>& cache, T* out,
                                        workspace memory) {
  cuda::expect_no_pending_error("densify");
  workspace_carver carver(memory);
  const auto scratch = cuda::add_densify_scratch(carver, cache.layout);
  cuda::densify<T, T>(backend.stream, cache, out, scratch);
}

template <storage_type T>
std::size_t backend_ops<cuda_backend>::linear_weight_grad_workspace_bytes(const cuda_backend&,
                                                                          const cache_layout& a,
                                                                          const linear_dims& d) {
  return workspace_bytes_of(
      [&](workspace_carver& carver) { cuda::add_linear_scratch<T>(carver, a, d); });
}

template <storage_type T>
void backend_ops<cuda_backend>::linear_weight_grad(const cuda_backend& backend,
                                                   const cache_view<const T>& a, const T* dz, T* dw,
                                                   const linear_dims& d, grad_mode mode,
                                                   workspace memory) {
  cuda::expect_no_pending_error("linear_weight_grad");
  workspace_carver carver(memory);
  const auto scratch = cuda::add_linear_scratch<T>(carver, a.layout, d);
  cuda::linear_weight_grad<T>(backend.stream, a, dz, dw, d, mode, backend.allow_tf32, scratch);
}

template <storage_type T>
std::size_t backend_ops<cuda_backend>::conv2d_weight_grad_workspace_bytes(
    const cuda_backend& backend, const cache_layout& x, const conv2d_geometry& g) {
  return workspace_bytes_of([&](workspace_carver& carver) {
    cuda::add_conv2d_scratch<T>(carver, x, g, backend.allow_tf32, backend.use_cudnn);
  });
}

template <storage_type T>
void backend_ops<cuda_backend>::conv2d_weight_grad(const cuda_backend& backend,
                                                   const cache_view<const T>& x, const T* dz, T* dw,
                                                   const conv2d_geometry& g, grad_mode mode,
                                                   workspace memory) {
  cuda::expect_no_pending_error("conv2d_weight_grad");
  workspace_carver carver(memory);
  const auto scratch =
      cuda::add_conv2d_scratch<T>(carver, x.layout, g, backend.allow_tf32, backend.use_cudnn);
  cuda::conv2d_weight_grad<T>(backend.stream, x, dz, dw, g, mode, backend.allow_tf32, scratch);
}

template <storage_type T>
void backend_ops<cuda_backend>::pack_relu_mask(const cuda_backend& backend, const T* x, T* y,
                                               std::int64_t n, std::uint32_t* words) {
  cuda::expect_no_pending_error("ReLU mask");
  cuda::pack_relu_mask<T>(backend.stream, x, y, n, words);
}

template <storage_type T>
void backend_ops<cuda_backend>::apply_relu_mask(const cuda_backend& backend,
                                                const std::uint32_t* words, const T* dy, T* dx,
                                                std::int64_t n) {
  cuda::expect_no_pending_error("ReLU mask");
  cuda::apply_relu_mask<T>(backend.stream, words, dy, dx, n);
}

template <storage_type T>
void backend_ops<cuda_backend>::pack_relu_mask_channels_last(const cuda_backend& backend,
                                                             const T* x, T* y,
                                                             const channels_last_dims& d,
                                                             std::uint32_t* words) {
  cuda::expect_no_pending_error("ReLU mask");
  cuda::pack_relu_mask_channels_last<T>(backend.stream, x, y, d, words);
}

template <storage_type T>
void backend_ops<cuda_backend>::apply_relu_mask_channels_last(const cuda_backend& backend,
                                                              const std::uint32_t* words,
                                                              const T* dy, T* dx,
                                                              const channels_last_dims& d) {
  cuda::expect_no_pending_error("ReLU mask");
  cuda::apply_relu_mask_channels_last<T>(backend.stream, words, dy, dx, d);
}

// The CUDA operations for every storage type, as explicit instantiations: declared (extern) in the
// nvcc translation units of a program that defines DROPIT_CUDA_INSTANCES, defined once in
// dropit/cuda_instances.cu. Such a program compiles every kernel (each selection, type and
// architecture) once instead of in every translation unit that reaches them.
#define DROPIT_CUDA_OPERATIONS(kind, T)                                                            \
  kind std::size_t backend_ops<cuda_backend>::compress_workspace_bytes<T>(                         \
      const cuda_backend&, const cache_layout&, const std::optional<channels_last_dims>&);         \
  kind void backend_ops<cuda_backend>::compress<T>(const cuda_backend&, const T*,                  \
                                                   const std::optional<channels_last_dims>&,       \
                                                   const cache_view<T>&, workspace);               \
  kind std::size_t backend_ops<cuda_backend>::densify_workspace_bytes<T>(const cuda_backend&,      \
                                                                         const cache_layout&);     \
  kind void backend_ops<cuda_backend>::densify<T>(const cuda_backend&, const cache_view<const T>&, \
                                                  T*, workspace);                                  \
  kind std::size_t backend_ops<cuda_backend>::linear_weight_grad_workspace_bytes<T>(               \
      const cuda_backend&, const cache_layout&, const linear_dims&);                               \
  kind void backend_ops<cuda_backend>::linear_weight_grad<T>(                                      \
      const cuda_backend&, const cache_view<const T>&, const T*, T*, const linear_dims&,           \
      grad_mode, workspace);                                                                       \
  kind std::size_t backend_ops<cuda_backend>::conv2d_weight_grad_workspace_bytes<T>(               \
      const cuda_backend&, const cache_layout&, const conv2d_geometry&);                           \
  kind void backend_ops<cuda_backend>::conv2d_weight_grad<T>(                                      \
      const cuda_backend&, const cache_view<const T>&, const T*, T*, const conv2d_geometry&,       \
      grad_mode, workspace);                                                                       \
  kind void backend_ops<cuda_backend>::pack_relu_mask<T>(const cuda_backend&, const T*, T*,        \
                                                         std::int64_t, std::uint32_t*);            \
  kind void backend_ops<cuda_backend>::apply_relu_mask<T>(                                         \
      const cuda_backend&, const std::uint32_t*, const T*, T*, std::int64_t);                      \
  kind void backend_ops<cuda_backend>::pack_relu_mask_channels_last<T>(                            \
      const cuda_backend&, const T*, T*, const channels_last_dims&, std::uint32_t*);               \
  kind void backend_ops<cuda_backend>::apply_relu_mask_channels_last<T>(                           \
      const cuda_backend&, const std::uint32_t*, const T*, T*, const channels_last_dims&);

#if defined(DROPIT_CUDA_INSTANCES)
DROPIT_CUDA_OPERATIONS(extern template, float)
DROPIT_CUDA_OPERATIONS(extern template, half)
DROPIT_CUDA_OPERATIONS(extern template, bfloat16)
#endif

}  // namespace dropit::detail
