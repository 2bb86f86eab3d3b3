#pragma once
/// @file
/// Autograd functions: linear and conv2d that save a compact cache of their input instead of the
/// input, and a ReLU that saves a 1-bit mask instead of its output. The input gradient always
/// uses the full weight; only the weight gradient is computed from the cache. Each records one
/// node of its own (node.hpp).

#include <cstddef>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "node.hpp"
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
  /// Moves the cache's tensors into `saved`, leaving the rest of it (its layout) in `cache`.
  static void save(detail::saved_tensors& saved, saved_cache& cache) {
    saved.save(std::exchange(cache.values, at::Tensor()));
    saved.save(std::exchange(cache.positions, at::Tensor()));
  }
  /// `cache` (what `save` left in it) with its tensors, `saved` from index `first` on.
  static saved_cache load(saved_cache cache, const ::torch::autograd::variable_list& saved,
                          std::size_t first) {
    cache.values = saved.at(first);
    cache.positions = saved.at(first + 1);
    return cache;
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
  static at::Tensor relu_backward(const at::Tensor& dy, const at::Tensor& mask) {
    return dropit::torch::relu_backward(dy, mask);
  }
};

/// y = x Wᵀ + b, caching x compactly when W needs a gradient. `bias` may be undefined.
template <class CacheOps>
struct basic_linear_function {
  struct backward_state {
    static constexpr const char* name = "dropit::LinearBackward";
    detail::saved_tensors saved;  // the weight, then the cache's tensors where W needs a gradient
    typename CacheOps::cache_type cache;  // its layout

    // dZ is read with the strides it comes with (the gradient of a sum is an expanded scalar):
    // torch's kernels take any, and the sparse weight gradient makes its own contiguous copy. A
    // missing bias has no gradient edge, so the node computes no gradient for it.
    ::torch::autograd::variable_list backward(const ::torch::autograd::Node& node,
                                              const at::Tensor& dz,
                                              const ::torch::autograd::variable_list& saved) const {
      const at::Tensor& weight = saved[0];
      // A 1-D input is a single row: dZ [N_out] is then its own bias gradient.
      const at::Tensor dz_rows = as_rows(dz, compat::static_sizes(dz).back());
      at::Tensor d_input, d_weight, d_bias;
      if (node.task_should_compute_output(0))
        d_input = dz.dim() == 2 ? at::mm(dz, weight) : at::matmul(dz, weight);
      if (node.task_should_compute_output(1))
        d_weight = CacheOps::linear_weight_grad(CacheOps::load(cache, saved, 1), dz_rows);
      if (node.task_should_compute_output(2)) d_bias = dz_rows.sum(0);
      return {d_input, d_weight, d_bias};
    }
  };

  static at::Tensor apply(const at::Tensor& input, const at::Tensor& weight,
                          const at::Tensor& bias, const typename CacheOps::policy_type& spec) {
    dropit::detail::expect(input.defined(), "linear input is an undefined tensor");
    return detail::record_layer<backward_state>({input, weight, bias}, [&](backward_state& state) {
      const dropit::shape input_shape(compat::static_sizes(input));
      const std::int64_t in_features = compat::static_sizes(weight).at(1);
      dropit::detail::expect(
          input_shape.rank >= 1 && input_shape[input_shape.rank - 1] == in_features,
          "linear input of shape ", input_shape, " does not end in ", in_features, " features");
      state.saved.save(weight);
      if (weight.requires_grad()) {
        state.cache = CacheOps::compress(input, spec);
        CacheOps::save(state.saved, state.cache);
      }
      return at::linear(input, weight, bias);
    });
  }
};

/// Conv2d with zero padding, caching its input compactly when the weight needs a gradient.
/// `bias` may be undefined.
template <class CacheOps>
struct basic_conv2d_function {
  struct backward_state {
    static constexpr const char* name = "dropit::Conv2dBackward";
    detail::saved_tensors saved;  // the weight, then the cache's tensors where W needs a gradient
    typename CacheOps::cache_type cache;  // its layout
    detail::conv2d_call call;

    ::torch::autograd::variable_list backward(const ::torch::autograd::Node& node,
                                              const at::Tensor& dz_as_given,
                                              const ::torch::autograd::variable_list& saved) const {
      const at::Tensor& weight = saved[0];
      const auto& [input_sizes, params] = call;
      // Contiguous, unlike linear's: torch's 16-bit convolution kernels round differently in
      // another memory format, and the gradients must not depend on the format dZ arrives in.
      const at::Tensor dz = dz_as_given.contiguous();
      const std::vector<std::int64_t> weight_size = compat::static_sizes(weight);
      const bool want_input = node.task_should_compute_output(0);
      const bool want_weight = node.task_should_compute_output(1);
      // A missing bias has no gradient edge, so the node computes no gradient for it.
      const bool want_bias = node.task_should_compute_output(2);
      at::Tensor d_input, d_weight, d_bias;
      const typename CacheOps::cache_type weight_cache =
          want_weight ? CacheOps::load(cache, saved, 1) : typename CacheOps::cache_type{};
      const bool densified =
          want_weight && preferred_weight_grad_path(weight_cache.layout,
                                                    conv2d_layer(weight_size, params),
                                                    dz.device()) == weight_grad_path::densify;
      if (densified) {
        // Both gradients from one call of torch's kernel (oneDNN, cuDNN) on the densified cache;
        // the input gradient reads only its shape. The bias gradient is a sum of its own: asked
        // for it too, oneDNN's backward adds several times the sum's host work on small layers.
        std::tie(d_input, d_weight, std::ignore) = dense_conv2d_backward(
            dz, CacheOps::densify(weight_cache), weight, params, {want_input, true, false});
      } else {
        if (want_input) d_input = conv2d_input_grad(dz, weight, input_sizes, params);
        if (want_weight)
          d_weight = CacheOps::conv2d_weight_grad(weight_cache, dz, weight_size, params);
      }
      if (want_bias) d_bias = dz.sum({0, 2, 3});
      return {d_input, d_weight, d_bias};
    }
  };

  static at::Tensor apply(const at::Tensor& input, const at::Tensor& weight,
                          const at::Tensor& bias, const conv2d_params& params,
                          const typename CacheOps::policy_type& spec) {
    dropit::detail::expect(input.defined(), "conv2d input is an undefined tensor");
    return detail::record_layer<backward_state>({input, weight, bias}, [&](backward_state& state) {
      state.call = {compat::static_sizes(input), params};
      const std::vector<std::int64_t>& input_sizes = state.call.input_sizes;
      dropit::detail::expect(input_sizes.size() == 4,
                             "conv2d input must be [N, C, H, W], got shape ",
                             dropit::shape(input_sizes));
      const std::int64_t weight_channels = compat::static_sizes(weight).at(1) * params.groups;
      dropit::detail::expect(input_sizes[1] == weight_channels, "conv2d input has ",
                             input_sizes[1], " channels; the weight expects ", weight_channels);
      state.saved.save(weight);
      if (weight.requires_grad()) {
        state.cache = CacheOps::compress(input, spec);
        CacheOps::save(state.saved, state.cache);
      }
      // The input itself, in whatever memory format it has: the output keeps it.
      return at::conv2d(input, weight, bias, torch_pair(params.stride),
                        torch_pair(params.padding), torch_pair(params.dilation), params.groups);
    });
  }
};

/// ReLU that saves one bit per element (where its output is positive) instead of its output.
template <class CacheOps>
struct basic_relu_function {
  struct backward_state {
    static constexpr const char* name = "dropit::ReLUBackward";
    detail::saved_tensors saved;  // the mask, in the output's logical order

    ::torch::autograd::variable_list backward(const ::torch::autograd::Node&, const at::Tensor& dy,
                                              const ::torch::autograd::variable_list& saved) const {
      return {CacheOps::relu_backward(dy, saved[0])};
    }
  };

  static at::Tensor apply(const at::Tensor& input) {
    return detail::record_layer<backward_state>({input}, [&](backward_state& state) {
      auto [output, mask] = CacheOps::relu_with_mask(input);
      state.saved.save(mask);
      return output;
    });
  }
};

using LinearFunction = basic_linear_function<direct_cache_ops>;
using Conv2dFunction = basic_conv2d_function<direct_cache_ops>;
using ReLUFunction = basic_relu_function<direct_cache_ops>;

}  // namespace dropit::torch
