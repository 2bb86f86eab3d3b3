#pragma once
/// @file
/// Umbrella header of the CUDA backend (needs nvcc): everything in dropit.hpp plus `cuda_backend`
/// and the definitions of the overloads of compress, densify, the weight gradients and the ReLU
/// mask that take it (declared in cuda.hpp, for code not compiled by nvcc).
///
/// The CUDA overloads mirror the CPU expert API: the caller passes device-accessible buffers
/// (device, managed or pinned memory) and a workspace sized by the matching `*_workspace_bytes`
/// query; the call validates on the host (throwing `dropit::error`), enqueues its kernels on
/// `backend.stream` and returns. It allocates nothing and never synchronises the device, so
/// buffers must stay alive until the stream has run the work. The results equal the CPU backend's:
/// kept sets, values and cache bytes bit for bit; weight gradients up to float summation order.
///
/// CUDA's cuda_fp16.h declares a global `half`: next to `using namespace dropit`, write
/// `dropit::half`.
///
/// CUDA errors (a rejected launch, an invalid pointer) throw `dropit::error` with the CUDA error's
/// name and description; errors of kernels that already ran surface at the caller's next CUDA
/// synchronisation, as usual.

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

// The core headers, seen by nvcc. Two of its diagnostics are about code the CUDA backend never runs
// on the device or never calls: shape's DROPIT_HOST_DEVICE members read a std::array (host-only
// without --expt-relaxed-constexpr; kernels get plain copies of what they need instead), and
// tensor_view / cache_view of a const type declare a conversion to themselves.
#if defined(__NVCC_DIAG_PRAGMA_SUPPORT__)
#pragma nv_diagnostic push
#pragma nv_diag_suppress 20013, 20015, 554
#endif
#include "dropit.hpp"
#if defined(__NVCC_DIAG_PRAGMA_SUPPORT__)
#pragma nv_diagnostic pop
#endif

#include "cuda.hpp"
#include "detail/cuda/cache_ops.cuh"
#include "detail/cuda/common.cuh"
#include "detail/cuda/weight_grad.cuh"

namespace dropit {

namespace detail::cuda {

template <class T>
void expect_device_view(const tensor_view<T>& view, const char* what) {
  expect_device_accessible(
      view.data, static_cast<std::size_t>(view.numel()) * sizeof(std::remove_const_t<T>), what);
}

template <class T>
void expect_device_cache(const cache_view<T>& view) {
  expect_device_accessible(view.values, view.layout.value_bytes(), "cache values buffer");
  expect_device_accessible(view.positions, view.layout.position_bytes(), "cache positions buffer");
}

}  // namespace detail::cuda

// ---------------------------------------------------------------------------------------------
// compress / densify

/// Workspace bytes `compress` needs on `backend` for a cache of `layout` (0 for chunked min-k and
/// random element caches, whose selection stays inside one block per chunk).
template <storage_type T>
std::size_t compress_workspace_bytes(const cuda_backend&, const cache_layout& layout) {
  detail::expect_layout<T>(layout);
  detail::cuda::workspace_carver carver;
  detail::cuda::add_compress_scratch(carver, layout);
  return carver.bytes();
}

/// Sparsifies the device tensor `input` into the caller's device cache buffers `out` (planned with
/// `plan_cache`), asynchronously on `backend.stream`.
template <storage_type T>
void compress(const cuda_backend& backend, tensor_view<const std::type_identity_t<T>> input,
              cache_view<T> out, workspace scratch) {
  detail::expect_input_matches<T>(out.layout, input, "compress input");
  detail::expect_buffers(out);
  detail::cuda::expect_device_view(input, "compress input");
  detail::cuda::expect_device_cache(out);
  detail::cuda::compress(backend.stream, input.data, out, scratch);
}

/// Workspace bytes `densify` needs on `backend` for a cache of `layout`.
template <storage_type T>
std::size_t densify_workspace_bytes(const cuda_backend&, const cache_layout& layout) {
  detail::expect_layout<T>(layout);
  detail::cuda::workspace_carver carver;
  detail::cuda::add_densify_scratch(carver, layout);
  return carver.bytes();
}

/// Writes the dense tensor a device cache stands for into the device tensor `out`: kept values
/// (scaled by n/k for random selection with `rescale`), zeros elsewhere.
template <storage_type T>
void densify(const cuda_backend& backend, cache_view<const std::type_identity_t<T>> cache,
             tensor_view<T> out, workspace scratch) {
  detail::expect_input_matches<T>(cache.layout, out, "densify output");
  detail::expect_buffers(cache);
  detail::cuda::expect_device_cache(cache);
  detail::cuda::expect_device_view(out, "densify output");
  detail::cuda::workspace_carver carver(scratch);
  const auto parts = detail::cuda::add_densify_scratch(carver, cache.layout);
  carver.expect_fits("densify");
  detail::cuda::expect_device_accessible(scratch.data(), carver.bytes(), "densify workspace");
  detail::cuda::densify<T, T>(backend.stream, cache, out.data, parts);
}

// ---------------------------------------------------------------------------------------------
// Weight gradients (shapes as in weight_grad.hpp)

/// Workspace bytes `linear_weight_grad` needs on `backend`.
template <storage_type T>
std::size_t linear_weight_grad_workspace_bytes(const cuda_backend&, const cache_layout& a,
                                               const shape& dz, const shape& dw) {
  detail::expect_layout<T>(a);
  detail::check_linear(a, dz, dw);
  detail::cuda::workspace_carver carver;
  detail::cuda::add_gradient_scratch(carver, a);
  return carver.bytes();
}

/// dW (=, or += with `grad_mode::accumulate`) dZᵀ · A, with A read from its device cache.
template <storage_type T>
void linear_weight_grad(const cuda_backend& backend, cache_view<const std::type_identity_t<T>> a,
                        tensor_view<const std::type_identity_t<T>> dz, tensor_view<T> dw,
                        grad_mode mode, workspace scratch) {
  const auto d = detail::check_linear(a.layout, dz.shape, dw.shape);
  detail::expect_gradient_operands(a, dz, dw);
  detail::cuda::expect_device_cache(a);
  detail::cuda::expect_device_view(dz, "dZ");
  detail::cuda::expect_device_view(dw, "dW");
  detail::cuda::workspace_carver carver(scratch);
  const auto parts = detail::cuda::add_gradient_scratch(carver, a.layout);
  carver.expect_fits("linear_weight_grad");
  detail::cuda::expect_device_accessible(scratch.data(), carver.bytes(),
                                         "linear_weight_grad workspace");
  detail::cuda::linear_weight_grad<T>(backend.stream, a, dz.data, dw.data, d.rows, d.in_features,
                                      d.out_features, mode, parts);
}

/// Workspace bytes `conv2d_weight_grad` needs on `backend`.
template <storage_type T>
std::size_t conv2d_weight_grad_workspace_bytes(const cuda_backend&, const cache_layout& x,
                                               const shape& dz, const shape& dw,
                                               const conv2d_params& params) {
  detail::expect_layout<T>(x);
  detail::check_conv2d(x, dz, dw, params);
  detail::cuda::workspace_carver carver;
  detail::cuda::add_gradient_scratch(carver, x);
  return carver.bytes();
}

/// dW (=, or += with `grad_mode::accumulate`) the conv2d weight gradient, with X read from its
/// device cache.
template <storage_type T>
void conv2d_weight_grad(const cuda_backend& backend, cache_view<const std::type_identity_t<T>> x,
                        tensor_view<const std::type_identity_t<T>> dz, tensor_view<T> dw,
                        const conv2d_params& params, grad_mode mode, workspace scratch) {
  const auto g = detail::check_conv2d(x.layout, dz.shape, dw.shape, params);
  detail::expect_gradient_operands(x, dz, dw);
  detail::cuda::expect_device_cache(x);
  detail::cuda::expect_device_view(dz, "dZ");
  detail::cuda::expect_device_view(dw, "dW");
  detail::cuda::workspace_carver carver(scratch);
  const auto parts = detail::cuda::add_gradient_scratch(carver, x.layout);
  carver.expect_fits("conv2d_weight_grad");
  detail::cuda::expect_device_accessible(scratch.data(), carver.bytes(),
                                         "conv2d_weight_grad workspace");
  detail::cuda::conv2d_weight_grad<T>(backend.stream, x, dz.data, dw.data, g, mode, parts);
}

// ---------------------------------------------------------------------------------------------
// ReLU masks (relu_mask.hpp)

/// Packs the mask of a device ReLU output `y` into the device buffer `words`
/// (`relu_mask_words(y.numel())` of them).
template <storage_type T>
void pack_relu_mask(const cuda_backend& backend, tensor_view<const std::type_identity_t<T>> y,
                    std::uint32_t* words) {
  const std::int64_t n = detail::check_pack_relu_mask(y, words);
  detail::cuda::expect_device_view(y, "ReLU output");
  detail::cuda::expect_device_accessible(words, static_cast<std::size_t>(relu_mask_words(n)) * 4,
                                         "ReLU mask buffer");
  detail::cuda::pack_relu_mask<T>(backend.stream, y.data, static_cast<T*>(nullptr), n, words);
}

/// ReLU forward and its mask in one pass on the device: `y = relu(x)`, and the mask of `y` into
/// `words` (`relu_mask_words(x.numel())` of them). `y` may alias `x`.
template <storage_type T>
void relu_with_mask(const cuda_backend& backend, tensor_view<const std::type_identity_t<T>> x,
                    tensor_view<T> y, std::uint32_t* words) {
  const std::int64_t n = detail::check_relu_with_mask(x, y, words);
  detail::cuda::expect_device_view(x, "ReLU input");
  detail::cuda::expect_device_view(y, "ReLU output");
  detail::cuda::expect_device_accessible(words, static_cast<std::size_t>(relu_mask_words(n)) * 4,
                                         "ReLU mask buffer");
  detail::cuda::pack_relu_mask<T>(backend.stream, x.data, y.data, n, words);
}

/// ReLU backward from the mask: `dx = mask ? dy : 0`, on the device. `dx` may alias `dy`.
template <storage_type T>
void apply_relu_mask(const cuda_backend& backend, const std::uint32_t* words,
                     tensor_view<const std::type_identity_t<T>> dy, tensor_view<T> dx) {
  const std::int64_t n = detail::check_apply_relu_mask(words, dy, dx);
  detail::cuda::expect_device_view(dy, "ReLU dy");
  detail::cuda::expect_device_view(dx, "ReLU dx");
  detail::cuda::expect_device_accessible(words, static_cast<std::size_t>(relu_mask_words(n)) * 4,
                                         "ReLU mask buffer");
  detail::cuda::apply_relu_mask<T>(backend.stream, words, dy.data, dx.data, n);
}

}  // namespace dropit
