#pragma once
/// @file
/// Autograd functions: linear and conv2d that save a compact cache of their input instead of the
/// input, and a ReLU that saves a 1-bit mask instead of its output. The input gradient always
/// uses the full weight; only the weight gradient is computed from the cache.

#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "tensor.hpp"

namespace dropit::torch {

namespace detail {

/// A C++ value kept for backward in autograd's saved data, which holds IValues: one entry for
/// the whole value, where saving it field by field costs a map entry (and lists an allocation)
/// per field on every call, and reading it back as many lookups and conversions.
template <class Value>
struct saved_value : ::torch::CustomClassHolder {
  explicit saved_value(Value v) : value(std::move(v)) {}
  Value value;
};

template <class Value>
void save_value(::torch::autograd::AutogradContext* ctx, const std::string& key, Value value) {
  ctx->saved_data[key] =
      c10::IValue::make_capsule(c10::make_intrusive<saved_value<Value>>(std::move(value)));
}

/// The value `save_value` saved under `key`; it lives as long as the autograd node.
template <class Value>
const Value& load_value(::torch::autograd::AutogradContext* ctx, const std::string& key) {
  const auto found = ctx->saved_data.find(key);
  dropit::detail::expect(found != ctx->saved_data.end() && found->second.isCapsule(),
                         "autograd node saved no '", key, "'");
  return static_cast<const saved_value<Value>&>(*found->second.toCapsule()).value;
}

/// Saves the weight and, when there is one, the cache's tensors (then `extra`) through
/// save_for_backward, so that saved-tensor hooks (checkpointing, offloading to the CPU) see all of
/// it; the layout, which follows from the policy, shape and dtype alone, travels as saved data.
inline void save_weight_and_cache(::torch::autograd::AutogradContext* ctx, const at::Tensor& weight,
                                  const saved_cache* cache, const at::Tensor& extra = {}) {
  if (cache == nullptr) {
    ctx->save_for_backward({weight});
    return;
  }
  ::torch::autograd::variable_list saved{weight, cache->values, cache->positions};
  if (extra.defined()) saved.push_back(extra);
  ctx->save_for_backward(saved);
  save_value(ctx, "layout", cache->layout);
}

/// The cache `save_weight_and_cache` saved (`saved` holds the weight first).
inline saved_cache load_cache(::torch::autograd::AutogradContext* ctx,
                              const ::torch::autograd::variable_list& saved) {
  dropit::detail::expect(saved.size() >= 3,
                         "this layer saved no cache of its input (its weight "
                         "did not require a gradient in forward)");
  saved_cache cache;
  cache.values = saved[1];
  cache.positions = saved[2];
  cache.layout = load_value<cache_layout>(ctx, "layout");
  return cache;
}

/// What a conv2d's backward needs besides its tensors.
struct conv2d_call {
  std::vector<std::int64_t> input_sizes;
  conv2d_params params;
};

}  // namespace detail

/// `tensors` as a layer under autocast computes: floating-point ones in the autocast dtype of
/// `input`'s device, so that the cache, the output and dZ share one dtype (torch's own linear and
/// conv2d cast the same way); unchanged where autocast is off. The casts are differentiable, so
/// float32 parameters still get float32 gradients.
template <class... Tensors>
std::tuple<Tensors...> autocast_layer_inputs(const at::Tensor& input, const Tensors&... tensors) {
  const std::optional<at::ScalarType> dtype = compat::autocast_dtype(input.device());
  const auto cast = [&](const at::Tensor& t) {
    return dtype && t.defined() && t.is_floating_point() ? t.to(*dtype) : t;
  };
  return {cast(tensors)...};
}

/// How the layers' autograd functions reach the cache operations. These call the adapters
/// directly (the C++ modules); the Python package's registered operators call the same adapters
/// through torch's dispatcher instead, so that torch.compile traces each as one operator.
struct direct_cache_ops {
  /// What a layer's forward passes on to `compress`: the policy of this call.
  using policy_type = policy_spec;
  /// What `compress` makes and the weight gradients read.
  using cache_type = saved_cache;

  static saved_cache compress(const at::Tensor& input, const policy_spec& spec) {
    return compress_for_layer(input, spec);
  }
  static void save(::torch::autograd::AutogradContext* ctx, const at::Tensor& weight,
                   const saved_cache* cache) {
    detail::save_weight_and_cache(ctx, weight, cache);
  }
  static saved_cache load(::torch::autograd::AutogradContext* ctx,
                          const ::torch::autograd::variable_list& saved) {
    return detail::load_cache(ctx, saved);
  }
  static at::Tensor densify(const saved_cache& cache) { return dropit::torch::densify(cache); }
  static at::Tensor linear_weight_grad(const saved_cache& cache, const at::Tensor& dz) {
    return dropit::torch::linear_weight_grad(cache, dz);
  }
  static at::Tensor conv2d_weight_grad(const saved_cache& cache, const at::Tensor& dz,
                                       at::IntArrayRef weight_size, const conv2d_params& params) {
    return dropit::torch::conv2d_weight_grad(cache, dz, weight_size, params,
                                             weight_grad_path::sparse);
  }
  static std::tuple<at::Tensor, at::Tensor> relu_with_mask(const at::Tensor& input) {
    return dropit::torch::relu_with_mask(input);
  }
  static at::Tensor relu_backward(const at::Tensor& dy, const at::Tensor& mask,
                                  at::MemoryFormat format) {
    return dropit::torch::relu_backward(dy, mask, format);
  }
};

/// y = x Wᵀ + b, caching x compactly when W needs a gradient.
template <class CacheOps>
struct basic_linear_function : public ::torch::autograd::Function<basic_linear_function<CacheOps>> {
  /// `bias_argument`: the bias, or an empty tensor for none (see compat::optional_argument).
  static at::Tensor forward(::torch::autograd::AutogradContext* ctx, const at::Tensor& input,
                            const at::Tensor& weight, const at::Tensor& bias_argument,
                            const typename CacheOps::policy_type& spec) {
    const at::Tensor bias = compat::from_optional_argument(bias_argument);
    dropit::detail::expect(input.defined(), "linear input is an undefined tensor");
    const dropit::shape input_shape(compat::static_sizes(input));
    const std::int64_t in_features = compat::static_sizes(weight).at(1);
    dropit::detail::expect(
        input_shape.rank >= 1 && input_shape[input_shape.rank - 1] == in_features,
        "linear input of shape ", input_shape, " does not end in ", in_features, " features");
    const typename CacheOps::cache_type cache =
        weight.requires_grad() ? CacheOps::compress(input, spec) : typename CacheOps::cache_type{};
    CacheOps::save(ctx, weight, weight.requires_grad() ? &cache : nullptr);
    return at::linear(input, weight, bias);
  }

  // dZ is read with the strides it comes with (the gradient of a sum is an expanded scalar):
  // torch's kernels take any, and the sparse weight gradient makes its own contiguous copy. A
  // missing bias has no gradient edge, so needs_input_grad(2) is false for it.
  static ::torch::autograd::variable_list backward(::torch::autograd::AutogradContext* ctx,
                                                   ::torch::autograd::variable_list grads) {
    const ::torch::autograd::variable_list saved = ctx->get_saved_variables();
    const at::Tensor& weight = saved[0];
    const at::Tensor& dz = grads[0];
    // A 1-D input is a single row: dZ [N_out] is then its own bias gradient.
    const at::Tensor dz_rows = as_rows(dz, compat::static_sizes(dz).back());
    at::Tensor d_input, d_weight, d_bias;
    if (ctx->needs_input_grad(0))
      d_input = dz.dim() == 2 ? at::mm(dz, weight) : at::matmul(dz, weight);
    if (ctx->needs_input_grad(1))
      d_weight = CacheOps::linear_weight_grad(CacheOps::load(ctx, saved), dz_rows);
    if (ctx->needs_input_grad(2)) d_bias = dz_rows.sum(0);
    return {d_input, d_weight, d_bias, at::Tensor()};
  }
};

/// Conv2d with zero padding, caching its input compactly when the weight needs a gradient.
template <class CacheOps>
struct basic_conv2d_function : public ::torch::autograd::Function<basic_conv2d_function<CacheOps>> {
  static at::Tensor forward(::torch::autograd::AutogradContext* ctx, const at::Tensor& input,
                            const at::Tensor& weight, const at::Tensor& bias_argument,
                            const conv2d_params& params,
                            const typename CacheOps::policy_type& spec) {
    const at::Tensor bias = compat::from_optional_argument(bias_argument);
    dropit::detail::expect(input.defined(), "conv2d input is an undefined tensor");
    const std::vector<std::int64_t> input_sizes = compat::static_sizes(input);
    dropit::detail::expect(input_sizes.size() == 4, "conv2d input must be [N, C, H, W], got shape ",
                           dropit::shape(input_sizes));
    const std::int64_t weight_channels = compat::static_sizes(weight).at(1) * params.groups;
    dropit::detail::expect(input_sizes[1] == weight_channels, "conv2d input has ", input_sizes[1],
                           " channels; the weight expects ", weight_channels);
    detail::save_value(ctx, "conv2d", detail::conv2d_call{input_sizes, params});
    const typename CacheOps::cache_type cache =
        weight.requires_grad() ? CacheOps::compress(input, spec) : typename CacheOps::cache_type{};
    CacheOps::save(ctx, weight, weight.requires_grad() ? &cache : nullptr);
    // The input itself, in whatever memory format it has: the output keeps it.
    return at::conv2d(input, weight, bias, torch_pair(params.stride), torch_pair(params.padding),
                      torch_pair(params.dilation), params.groups);
  }

  static ::torch::autograd::variable_list backward(::torch::autograd::AutogradContext* ctx,
                                                   ::torch::autograd::variable_list grads) {
    const ::torch::autograd::variable_list saved = ctx->get_saved_variables();
    const at::Tensor& weight = saved[0];
    // Contiguous, unlike linear's: torch's 16-bit convolution kernels round differently in another
    // memory format, and the gradients must not depend on the format dZ arrives in.
    const at::Tensor dz = grads[0].contiguous();
    const auto& [input_sizes, params] = detail::load_value<detail::conv2d_call>(ctx, "conv2d");
    const std::vector<std::int64_t> weight_size = compat::static_sizes(weight);
    const bool want_input = ctx->needs_input_grad(0), want_weight = ctx->needs_input_grad(1);
    // A missing bias has no gradient edge: needs_input_grad(2) is false for it.
    const bool want_bias = ctx->needs_input_grad(2);
    at::Tensor d_input, d_weight, d_bias;
    const typename CacheOps::cache_type cache =
        want_weight ? CacheOps::load(ctx, saved) : typename CacheOps::cache_type{};
    const bool densified =
        want_weight && preferred_weight_grad_path(cache.layout, conv2d_layer(weight_size, params),
                                                  dz.device()) == weight_grad_path::densify;
    if (densified) {
      // Both gradients from one call of torch's kernel (oneDNN, cuDNN) on the densified cache; the
      // input gradient reads only its shape. The bias gradient is a sum of its own: asked for it
      // too, oneDNN's backward adds several times the sum's host work on small layers.
      std::tie(d_input, d_weight, std::ignore) = dense_conv2d_backward(
          dz, CacheOps::densify(cache), weight, params, {want_input, true, false});
    } else {
      if (want_input) d_input = conv2d_input_grad(dz, weight, input_sizes, params);
      if (want_weight) d_weight = CacheOps::conv2d_weight_grad(cache, dz, weight_size, params);
    }
    if (want_bias) d_bias = dz.sum({0, 2, 3});
    return {d_input, d_weight, d_bias, at::Tensor(), at::Tensor()};
  }
};

/// ReLU that saves one bit per element (where its output is positive) instead of its output.
template <class CacheOps>
struct basic_relu_function : public ::torch::autograd::Function<basic_relu_function<CacheOps>> {
  static at::Tensor forward(::torch::autograd::AutogradContext* ctx, const at::Tensor& input) {
    auto [output, mask] = CacheOps::relu_with_mask(input);
    ctx->save_for_backward({mask});
    ctx->saved_data["channels_last"] = relu_memory_format(output) == at::MemoryFormat::ChannelsLast;
    return output;
  }

  static ::torch::autograd::variable_list backward(::torch::autograd::AutogradContext* ctx,
                                                   ::torch::autograd::variable_list grads) {
    const bool channels_last = ctx->saved_data["channels_last"].toBool();
    return {CacheOps::relu_backward(
        grads[0], ctx->get_saved_variables()[0],
        channels_last ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous)};
  }
};

using LinearFunction = basic_linear_function<direct_cache_ops>;
using Conv2dFunction = basic_conv2d_function<direct_cache_ops>;
using ReLUFunction = basic_relu_function<direct_cache_ops>;

}  // namespace dropit::torch
