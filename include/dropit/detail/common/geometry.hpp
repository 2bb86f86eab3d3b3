#pragma once
// The shapes of the weight gradients: the checks every backend's entry point runs, and the
// dimensions and convolution geometry the backends then compute with.

#include <cstdint>
#include <limits>

#include "../../cache.hpp"
#include "../../config.hpp"
#include "../../shape.hpp"

namespace dropit {

/// Convolution hyper-parameters, as in torch::nn::Conv2d.
struct conv2d_params {
  std::int64_t stride[2] = {1, 1};
  std::int64_t padding[2] = {0, 0};
  std::int64_t dilation[2] = {1, 1};
  std::int64_t groups = 1;
};

namespace detail {

/// The dimensions of a linear weight gradient: dW[out_features, in_features] = dZ[rows,
/// out_features]^T A[rows, in_features].
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

/// Everything the conv2d weight-gradient kernels of every backend compute with, derived and
/// checked once on the host.
struct conv2d_geometry {
  std::int64_t batch, in_channels, height, width;
  std::int64_t out_channels, out_height, out_width;
  std::int64_t kernel_h, kernel_w;
  std::int64_t stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w, groups;

  DROPIT_HOST_DEVICE std::int64_t in_per_group() const { return in_channels / groups; }
  DROPIT_HOST_DEVICE std::int64_t out_per_group() const { return out_channels / groups; }
};

/// Validates a conv2d weight-gradient call and returns its geometry.
inline conv2d_geometry check_conv2d(const cache_layout& x, const shape& dz, const shape& dw,
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
  conv2d_geometry g{};
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

}  // namespace detail
}  // namespace dropit
