#pragma once
/// @file
/// Weight gradients computed from a compact cache, on any backend:
/// - linear: `dW = dZᵀ · A`, `A` cached as [..., K_in] (leading dims flattened to M), `dZ`
///   [M, N_out] (or with the same leading dims as `A`), `dW` [N_out, K_in];
/// - conv2d: `X` cached as [N, C_in, H, W], `dZ` [N, C_out, H_out, W_out],
///   `dW` [C_out, C_in / groups, KH, KW].
///
/// Each has an expert overload (caller's workspace, sized by the `*_workspace_bytes` query) and a
/// CPU convenience overload that allocates. Sums accumulate in float whatever the element type.

#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "backend.hpp"
#include "cache.hpp"
#include "detail/common/geometry.hpp"
#include "detail/common/operands.hpp"
#include "detail/cpu/backend_ops.hpp"
#include "shape.hpp"

namespace dropit {

namespace detail {

template <backend_type B, class T, class U, class V>
void expect_gradient_operands(const B& backend, const cache_view<const T>& cache,
                              const tensor_view<U>& dz, const tensor_view<V>& dw) {
  expect_buffers(cache);
  expect_data(dz, "dZ");
  expect_data(dw, "dW");
  expect_accessible(backend, cache);
  expect_accessible(backend, dz, "dZ");
  expect_accessible(backend, dw, "dW");
}

}  // namespace detail

/// Workspace bytes `linear_weight_grad` needs.
template <storage_type T, backend_type Backend>
std::size_t linear_weight_grad_workspace_bytes(const Backend& backend, const cache_layout& a,
                                               const shape& dz, const shape& dw) {
  detail::expect_layout<T>(a);
  const auto d = detail::check_linear(a, dz, dw);
  return detail::backend_ops<Backend>::template linear_weight_grad_workspace_bytes<T>(backend, a,
                                                                                      d);
}

/// dW (=, or += with `grad_mode::accumulate`) dZᵀ · A, with A read from its cache.
template <storage_type T, backend_type Backend>
void linear_weight_grad(const Backend& backend, cache_view<const std::type_identity_t<T>> a,
                        tensor_view<const std::type_identity_t<T>> dz, tensor_view<T> dw,
                        grad_mode mode, workspace scratch) {
  using ops = detail::backend_ops<Backend>;
  const auto d = detail::check_linear(a.layout, dz.shape, dw.shape);
  detail::expect_gradient_operands(backend, a, dz, dw);
  detail::expect_workspace(
      backend, scratch, ops::template linear_weight_grad_workspace_bytes<T>(backend, a.layout, d),
      "linear_weight_grad", "linear_weight_grad workspace");
  ops::template linear_weight_grad<T>(backend, a, dz.data, dw.data, d, mode, scratch);
}

template <storage_type T>
void linear_weight_grad(const cpu_backend& backend, cache_view<const std::type_identity_t<T>> a,
                        tensor_view<const std::type_identity_t<T>> dz, tensor_view<T> dw,
                        grad_mode mode = grad_mode::overwrite) {
  const std::size_t bytes =
      linear_weight_grad_workspace_bytes<T>(backend, a.layout, dz.shape, dw.shape);
  auto memory = detail::allocate<std::byte>(bytes, "linear_weight_grad workspace");
  linear_weight_grad<T>(backend, a, dz, dw, mode, workspace(memory));
}

/// Workspace bytes `conv2d_weight_grad` needs.
template <storage_type T, backend_type Backend>
std::size_t conv2d_weight_grad_workspace_bytes(const Backend& backend, const cache_layout& x,
                                               const shape& dz, const shape& dw,
                                               const conv2d_params& params) {
  detail::expect_layout<T>(x);
  const auto g = detail::check_conv2d(x, dz, dw, params);
  return detail::backend_ops<Backend>::template conv2d_weight_grad_workspace_bytes<T>(backend, x,
                                                                                      g);
}

/// dW (=, or += with `grad_mode::accumulate`) the conv2d weight gradient, with X read from its
/// cache.
template <storage_type T, backend_type Backend>
void conv2d_weight_grad(const Backend& backend, cache_view<const std::type_identity_t<T>> x,
                        tensor_view<const std::type_identity_t<T>> dz, tensor_view<T> dw,
                        const conv2d_params& params, grad_mode mode, workspace scratch) {
  using ops = detail::backend_ops<Backend>;
  const auto g = detail::check_conv2d(x.layout, dz.shape, dw.shape, params);
  detail::expect_gradient_operands(backend, x, dz, dw);
  detail::expect_workspace(
      backend, scratch, ops::template conv2d_weight_grad_workspace_bytes<T>(backend, x.layout, g),
      "conv2d_weight_grad", "conv2d_weight_grad workspace");
  ops::template conv2d_weight_grad<T>(backend, x, dz.data, dw.data, g, mode, scratch);
}

template <storage_type T>
void conv2d_weight_grad(const cpu_backend& backend, cache_view<const std::type_identity_t<T>> x,
                        tensor_view<const std::type_identity_t<T>> dz, tensor_view<T> dw,
                        const conv2d_params& params, grad_mode mode = grad_mode::overwrite) {
  const std::size_t bytes =
      conv2d_weight_grad_workspace_bytes<T>(backend, x.layout, dz.shape, dw.shape, params);
  auto memory = detail::allocate<std::byte>(bytes, "conv2d_weight_grad workspace");
  conv2d_weight_grad<T>(backend, x, dz, dw, params, mode, workspace(memory));
}

}  // namespace dropit
