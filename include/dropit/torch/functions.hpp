#pragma once
/// @file
/// Autograd functions: linear and conv2d that save a compact cache of their input instead of the
/// input, and a ReLU that saves a 1-bit mask instead of its output. The input gradient always
/// uses the full weight; only the weight gradient is computed from the cache.

#include <optional>
#include <vector>

#include "tensor.hpp"

namespace dropit::torch {

namespace detail {

/// Saves the weight and, when there is one, the cache through save_for_backward, its layout as an
/// int64 tensor: saved-tensor hooks (checkpointing, offloading to the CPU) then see all of it, and a
/// forward recomputed by checkpointing replaces values, positions and layout together.
inline void save_weight_and_cache(::torch::autograd::AutogradContext* ctx, const at::Tensor& weight,
                                  const saved_cache* cache) {
  if (cache == nullptr) {
    ctx->save_for_backward({weight});
    return;
  }
  const std::vector<std::int64_t> layout = cache->packed_layout();
  ctx->save_for_backward({weight, cache->values, cache->positions,
                          at::tensor(layout, at::TensorOptions().dtype(at::kLong))});
}

/// The cache `save_weight_and_cache` saved (`saved` holds the weight first).
inline saved_cache load_cache(const ::torch::autograd::variable_list& saved) {
  dropit::detail::expect(saved.size() == 4, "this layer saved no cache of its input (its weight "
                         "did not require a gradient in forward)");
  saved_cache cache;
  cache.values = saved[1];
  cache.positions = saved[2];
  const at::Tensor& layout = saved[3];
  cache.layout = saved_cache::unpack_layout(std::vector<std::int64_t>(
      layout.data_ptr<std::int64_t>(), layout.data_ptr<std::int64_t>() + layout.numel()));
  return cache;
}

}  // namespace detail

/// y = x Wᵀ + b, caching x compactly when W needs a gradient.
struct LinearFunction : public ::torch::autograd::Function<LinearFunction> {
  /// `bias_argument`: the bias, or an empty tensor for none (see compat::optional_argument).
  static at::Tensor forward(::torch::autograd::AutogradContext* ctx, const at::Tensor& input,
                            const at::Tensor& weight, const at::Tensor& bias_argument,
                            const policy_spec& spec) {
    const at::Tensor bias = compat::from_optional_argument(bias_argument);
    expect_usable(input, "linear input");
    dropit::detail::expect(input.dim() >= 1 && input.size(-1) == weight.size(1),
                           "linear input of shape ", shape_of(input), " does not end in ",
                           weight.size(1), " features");
    ctx->saved_data["has_bias"] = bias.defined();
    const saved_cache cache =
        weight.requires_grad() ? compress_for_layer(input, spec) : saved_cache{};
    detail::save_weight_and_cache(ctx, weight, weight.requires_grad() ? &cache : nullptr);
    return at::linear(input, weight, bias);
  }

  static ::torch::autograd::variable_list backward(::torch::autograd::AutogradContext* ctx,
                                                   ::torch::autograd::variable_list grads) {
    const ::torch::autograd::variable_list saved = ctx->get_saved_variables();
    const at::Tensor& weight = saved[0];
    const at::Tensor dz = grads[0].contiguous();
    // A 1-D input is a single row: dZ [N_out] is then its own bias gradient.
    const at::Tensor dz_rows = dz.reshape({-1, dz.size(-1)});
    at::Tensor d_input, d_weight, d_bias;
    if (ctx->needs_input_grad(0)) d_input = at::matmul(dz, weight);
    if (ctx->needs_input_grad(1)) d_weight = linear_weight_grad(detail::load_cache(saved), dz_rows);
    if (ctx->saved_data["has_bias"].toBool() && ctx->needs_input_grad(2)) d_bias = dz_rows.sum(0);
    return {d_input, d_weight, d_bias, at::Tensor()};
  }
};

/// Conv2d with zero padding, caching its input compactly when the weight needs a gradient.
struct Conv2dFunction : public ::torch::autograd::Function<Conv2dFunction> {
  static at::Tensor forward(::torch::autograd::AutogradContext* ctx, const at::Tensor& input,
                            const at::Tensor& weight, const at::Tensor& bias_argument,
                            const conv2d_params& params, const policy_spec& spec) {
    const at::Tensor bias = compat::from_optional_argument(bias_argument);
    expect_usable(input, "conv2d input");
    dropit::detail::expect(input.dim() == 4, "conv2d input must be [N, C, H, W], got shape ",
                           shape_of(input));
    dropit::detail::expect(input.size(1) == weight.size(1) * params.groups, "conv2d input has ",
                           input.size(1), " channels; the weight expects ",
                           weight.size(1) * params.groups);
    ctx->saved_data["has_bias"] = bias.defined();
    ctx->saved_data["input_sizes"] = input.sizes().vec();
    ctx->saved_data["stride"] = torch_pair(params.stride);
    ctx->saved_data["padding"] = torch_pair(params.padding);
    ctx->saved_data["dilation"] = torch_pair(params.dilation);
    ctx->saved_data["groups"] = params.groups;
    const saved_cache cache =
        weight.requires_grad() ? compress_for_layer(input, spec) : saved_cache{};
    detail::save_weight_and_cache(ctx, weight, weight.requires_grad() ? &cache : nullptr);
    return at::conv2d(input, weight, bias, torch_pair(params.stride), torch_pair(params.padding),
                      torch_pair(params.dilation), params.groups);
  }

  static ::torch::autograd::variable_list backward(::torch::autograd::AutogradContext* ctx,
                                                   ::torch::autograd::variable_list grads) {
    const ::torch::autograd::variable_list saved = ctx->get_saved_variables();
    const at::Tensor& weight = saved[0];
    const at::Tensor dz = grads[0].contiguous();
    const auto input_sizes = ctx->saved_data["input_sizes"].toIntVector();
    const conv2d_params params = conv2d_params_of(
        ctx->saved_data["stride"].toIntVector(), ctx->saved_data["padding"].toIntVector(),
        ctx->saved_data["dilation"].toIntVector(), ctx->saved_data["groups"].toInt());
    const bool want_input = ctx->needs_input_grad(0), want_weight = ctx->needs_input_grad(1);
    at::Tensor d_input, d_weight, d_bias;
    const saved_cache cache = want_weight ? detail::load_cache(saved) : saved_cache{};
    const bool densified =
        want_weight && preferred_weight_grad_path(cache.layout, conv2d_layer(weight.sizes(), params),
                                                  dz.device()) == weight_grad_path::densify;
    if (densified) {
      // Both gradients from one call of torch's kernel (oneDNN, cuDNN) on the densified cache; the
      // input gradient reads only its shape.
      std::tie(d_input, d_weight, std::ignore) = dense_conv2d_backward(
          dz, densify(cache), weight, params, {want_input, true, false});
    } else {
      if (want_input) d_input = conv2d_input_grad(dz, weight, input_sizes, params);
      if (want_weight)
        d_weight = conv2d_weight_grad(cache, dz, weight.sizes(), params, weight_grad_path::sparse);
    }
    if (ctx->saved_data["has_bias"].toBool() && ctx->needs_input_grad(2))
      d_bias = dz.sum({0, 2, 3});
    return {d_input, d_weight, d_bias, at::Tensor(), at::Tensor()};
  }
};

/// ReLU that saves one bit per element (where its output is positive) instead of its output.
struct ReLUFunction : public ::torch::autograd::Function<ReLUFunction> {
  static at::Tensor forward(::torch::autograd::AutogradContext* ctx, const at::Tensor& input) {
    expect_usable(input, "ReLU input");
    // One pass writes the output and its mask: the output is not read back to pack it.
    at::Tensor output = at::empty_like(input, at::MemoryFormat::Contiguous);
    at::Tensor mask = at::empty({relu_mask_words(input.numel())}, input.options().dtype(at::kInt));
    on_device_of(input, "ReLU input", [&](const auto& backend) {
      visit_dtype(input.scalar_type(), "ReLU input", [&](auto tag) {
        using T = decltype(tag);
        relu_with_mask<T>(backend, const_view<T>(input, "ReLU input"),
                          mutable_view<T>(output, "ReLU output"),
                          static_cast<std::uint32_t*>(mask.data_ptr()));
      });
    });
    ctx->save_for_backward({mask});
    return output;
  }

  static ::torch::autograd::variable_list backward(::torch::autograd::AutogradContext* ctx,
                                                   ::torch::autograd::variable_list grads) {
    const at::Tensor dy = grads[0].contiguous();
    const at::Tensor mask = ctx->get_saved_variables()[0];
    at::Tensor dx = at::empty_like(dy);
    on_device_of(dy, "ReLU gradient", [&](const auto& backend) {
      visit_dtype(dy.scalar_type(), "ReLU gradient", [&](auto tag) {
        using T = decltype(tag);
        apply_relu_mask<T>(backend, static_cast<const std::uint32_t*>(mask.data_ptr()),
                           const_view<T>(dy, "ReLU gradient"), mutable_view<T>(dx, "ReLU dx"));
      });
    });
    return {dx};
  }
};

}  // namespace dropit::torch
