#pragma once
/// @file
/// Weight gradients computed straight from a compact cache, with work proportional to the kept
/// count:
/// - linear: `dW = dZᵀ · A`, `A` cached as [..., K_in] (leading dims flattened to M), `dZ` [M,
/// N_out]
///   (or with the same leading dims as `A`), `dW` [N_out, K_in];
/// - conv2d: `X` cached as [N, C_in, H, W], `dZ` [N, C_out, H_out, W_out],
///   `dW` [C_out, C_in / groups, KH, KW].
///
/// Each has an expert overload (caller's workspace, sized by the `*_workspace_bytes` query) and a
/// convenience overload that allocates. Sums accumulate in float whatever the element type.

#include <cstddef>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "backend.hpp"
#include "cache.hpp"
#include "detail/cpu/weight_grad.hpp"
#include "shape.hpp"

namespace dropit {

/// Convolution hyper-parameters, as in torch::nn::Conv2d.
struct conv2d_params {
  std::int64_t stride[2] = {1, 1};
  std::int64_t padding[2] = {0, 0};
  std::int64_t dilation[2] = {1, 1};
  std::int64_t groups = 1;
};

namespace detail {

struct linear_dims {
  std::int64_t rows, in_features, out_features;
};

/// Validates a linear weight-gradient call and returns its dimensions.
inline linear_dims check_linear(const cache_layout& a, const shape& dz, const shape& dw) {
  validate_layout(a);
  dz.validate("dZ");
  dw.validate("dW");
  expect(a.shape.rank >= 1, "linear input must have rank >= 1, got shape ", a.shape);
  const std::int64_t in_features = a.shape[a.shape.rank - 1];
  const std::int64_t rows = a.shape.product(0, a.shape.rank - 1);
  expect(dz.rank >= 1, "dZ must have rank >= 1, got shape ", dz);
  const std::int64_t out_features = dz[dz.rank - 1];
  // dZ is [M, N_out], or carries A's leading dimensions: [..., N_out].
  bool leading_match = dz.rank == 2 && dz[0] == rows;
  if (dz.rank == a.shape.rank) {
    leading_match = true;
    for (int axis = 0; axis + 1 < dz.rank; ++axis) leading_match &= dz[axis] == a.shape[axis];
  }
  expect(leading_match, "dZ has shape ", dz, " but the cached input ", a.shape, " has ", rows,
         " rows: expected [", rows, ", N_out] or its leading dimensions followed by N_out");
  expect(dw.rank == 2 && dw[0] == out_features && dw[1] == in_features, "dW has shape ", dw,
         " but expected [", out_features, ", ", in_features, "]");
  return {rows, in_features, out_features};
}

inline std::int64_t conv_output_extent(std::int64_t in, std::int64_t kernel, std::int64_t stride,
                                       std::int64_t pad, std::int64_t dilation, const char* axis) {
  const std::int64_t padded = checked_add(in, checked_mul(std::int64_t{2}, pad, "conv2d padding"),
                                          "conv2d padded input ", axis);
  const std::int64_t reach = checked_mul(dilation, kernel - 1, "conv2d dilated kernel ", axis);
  const std::int64_t span = padded - reach - 1;
  expect(span >= 0, "conv2d output ", axis, " is <= 0 (input ", in, ", kernel ", kernel,
         ", padding ", pad, ", dilation ", dilation, "); expected a positive output size");
  const std::int64_t out = span / stride + 1;
  // The CPU kernels look output coordinates up in 32-bit tables.
  expect(out <= std::numeric_limits<std::int32_t>::max(), "conv2d output ", axis, " ", out,
         " exceeds ", std::numeric_limits<std::int32_t>::max());
  return out;
}

/// Validates a conv2d weight-gradient call and returns its geometry.
inline cpu::conv2d_geometry check_conv2d(const cache_layout& x, const shape& dz, const shape& dw,
                                         const conv2d_params& p) {
  validate_layout(x);
  dz.validate("conv2d dZ");
  dw.validate("conv2d dW");
  expect(x.shape.rank == 4, "conv2d input must be [N, C_in, H, W], got shape ", x.shape);
  expect(dz.rank == 4, "conv2d dZ must be [N, C_out, H_out, W_out], got shape ", dz);
  expect(dw.rank == 4, "conv2d dW must be [C_out, C_in/groups, KH, KW], got shape ", dw);
  for (int i = 0; i < 2; ++i) {
    expect(p.stride[i] >= 1, "conv2d stride ", p.stride[i], " must be >= 1");
    expect(p.dilation[i] >= 1, "conv2d dilation ", p.dilation[i], " must be >= 1");
    expect(p.padding[i] >= 0, "conv2d padding ", p.padding[i], " must be >= 0");
  }
  expect(p.groups >= 1, "conv2d groups ", p.groups, " must be >= 1");
  cpu::conv2d_geometry g{};
  g.batch = x.shape[0];
  g.in_channels = x.shape[1];
  g.height = x.shape[2];
  g.width = x.shape[3];
  g.out_channels = dw[0];
  g.kernel_h = dw[2];
  g.kernel_w = dw[3];
  g.stride_h = p.stride[0];
  g.stride_w = p.stride[1];
  g.pad_h = p.padding[0];
  g.pad_w = p.padding[1];
  g.dilation_h = p.dilation[0];
  g.dilation_w = p.dilation[1];
  g.groups = p.groups;
  expect(g.in_channels % g.groups == 0, "conv2d groups ", g.groups,
         " does not divide the input channels ", g.in_channels);
  expect(g.out_channels % g.groups == 0, "conv2d groups ", g.groups,
         " does not divide the output channels ", g.out_channels);
  expect(dw[1] == g.in_channels / g.groups, "dW has shape ", dw,
         " but expected C_in/groups = ", g.in_channels / g.groups, " in dimension 1");
  expect(g.kernel_h >= 1 && g.kernel_w >= 1, "conv2d kernel ", g.kernel_h, "x", g.kernel_w,
         " must be at least 1x1");
  g.out_height =
      conv_output_extent(g.height, g.kernel_h, g.stride_h, g.pad_h, g.dilation_h, "height");
  g.out_width = conv_output_extent(g.width, g.kernel_w, g.stride_w, g.pad_w, g.dilation_w, "width");
  const shape expected_dz{g.batch, g.out_channels, g.out_height, g.out_width};
  expect(dz == expected_dz, "dZ has shape ", dz, " but the convolution produces ", expected_dz);
  return g;
}

template <class T, class U, class V>
void expect_gradient_operands(const cache_view<const T>& cache, const tensor_view<U>& dz,
                              const tensor_view<V>& dw) {
  expect_buffers(cache);
  expect_data(dz, "dZ");
  expect_data(dw, "dW");
}

}  // namespace detail

/// Workspace bytes `linear_weight_grad` needs.
template <storage_type T>
std::size_t linear_weight_grad_workspace_bytes(const cpu_backend& backend, const cache_layout& a,
                                               const shape& dz, const shape& dw) {
  detail::expect_layout<T>(a);
  const auto d = detail::check_linear(a, dz, dw);
  detail::cpu::workspace_carver carver;
  detail::cpu::add_linear_scratch<T>(carver, backend, a, d.rows, d.in_features, d.out_features);
  return carver.bytes();
}

/// dW (=, or += with `grad_mode::accumulate`) dZᵀ · A, with A read from its cache.
template <storage_type T>
void linear_weight_grad(const cpu_backend& backend, cache_view<const std::type_identity_t<T>> a,
                        tensor_view<const std::type_identity_t<T>> dz, tensor_view<T> dw,
                        grad_mode mode, workspace scratch) {
  const auto d = detail::check_linear(a.layout, dz.shape, dw.shape);
  detail::expect_gradient_operands(a, dz, dw);
  detail::cpu::workspace_carver carver(scratch);
  const auto parts = detail::cpu::add_linear_scratch<T>(carver, backend, a.layout, d.rows,
                                                        d.in_features, d.out_features);
  carver.expect_fits("linear_weight_grad");
  detail::cpu::linear_weight_grad<T>(backend, a, dz.data, dw.data, d.rows, d.in_features,
                                     d.out_features, mode, parts);
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
template <storage_type T>
std::size_t conv2d_weight_grad_workspace_bytes(const cpu_backend& backend, const cache_layout& x,
                                               const shape& dz, const shape& dw,
                                               const conv2d_params& params) {
  detail::expect_layout<T>(x);
  const auto g = detail::check_conv2d(x, dz, dw, params);
  detail::cpu::workspace_carver carver;
  detail::cpu::add_conv2d_scratch(carver, backend, x, g);
  return carver.bytes();
}

/// dW (=, or += with `grad_mode::accumulate`) the conv2d weight gradient, with X read from its
/// cache.
template <storage_type T>
void conv2d_weight_grad(const cpu_backend& backend, cache_view<const std::type_identity_t<T>> x,
                        tensor_view<const std::type_identity_t<T>> dz, tensor_view<T> dw,
                        const conv2d_params& params, grad_mode mode, workspace scratch) {
  const auto g = detail::check_conv2d(x.layout, dz.shape, dw.shape, params);
  detail::expect_gradient_operands(x, dz, dw);
  detail::cpu::workspace_carver carver(scratch);
  const auto parts = detail::cpu::add_conv2d_scratch(carver, backend, x.layout, g);
  carver.expect_fits("conv2d_weight_grad");
  detail::cpu::conv2d_weight_grad<T>(backend, x, dz.data, dw.data, g, mode, parts);
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
