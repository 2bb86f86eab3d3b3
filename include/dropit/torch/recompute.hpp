#pragma once
/// @file
/// Exact recomputation of a layer's input. A cheap producer (dropit::torch::LayerNorm, BatchNorm2d,
/// GELU, SiLU, and a dropit ReLU applied to a producer's output) marks its output with how to
/// compute it again from tensors autograd keeps anyway for the producer's own backward (its input
/// and parameters). A dropit Linear or Conv2d that reads such an output, untouched, saves those
/// tensors instead of a cache and recomputes its input in backward with the same kernels (after
/// BatchNorm in training, one affine pass from the batch statistics it saved, equal within
/// rounding): it holds nothing of its own, and its weight gradient is the dense one, whatever γ.
///
/// The marks are held weakly, per thread: marking keeps no tensor alive, and a layer that finds no
/// valid mark (another thread, a view or an in-place change of the output, a changed source,
/// autocast) caches its input as before.

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <torch/autograd.h>

#include "../config.hpp"
#include "compat.hpp"
#include "functions.hpp"

namespace dropit::torch {
namespace detail {

/// How a producer computes its output from its sources.
struct producer_recipe {
  enum class kind : std::int64_t { layer_norm, batch_norm, gelu, silu };

  kind what = kind::gelu;
  std::vector<std::int64_t> normalized_shape;  // layer_norm
  double eps = 0.0;                            // layer_norm, batch_norm
  /// batch_norm: normalised with the batch's own statistics (training), else the running ones.
  bool batch_statistics = true;
  std::string approximate = "none";  // gelu
  /// A dropit ReLU ran on the producer's output.
  bool relu = false;

  /// The producer's output. Sources: layer_norm (input, weight, bias); batch_norm (input, weight,
  /// bias, then the running mean and variance unless batch_statistics, else the batch's mean and
  /// inverse standard deviation when the forward's autograd node keeps them); gelu and silu
  /// (input).
  at::Tensor compute(const std::vector<at::Tensor>& sources) const {
    at::Tensor output = compute_producer(sources);
    // In place on the fresh producer output: one activation transient in backward, as dense
    // holds. max(x, 0), as dropit's ReLU kernel computed it in forward.
    return relu ? output.relu_() : output;
  }

  /// BatchNorm's forward: torch's kernel (the one torch::nn::BatchNorm2d reaches on the CPU), as
  /// (output, the batch's mean, its inverse standard deviation); the two statistics are defined
  /// when `batch_statistics`.
  static std::tuple<at::Tensor, at::Tensor, at::Tensor> batch_norm(
      const at::Tensor& input, const at::Tensor& weight, const at::Tensor& bias,
      const at::Tensor& running_mean, const at::Tensor& running_var, bool batch_statistics,
      double momentum, double eps) {
    return at::native_batch_norm(input, weight, bias, running_mean, running_var, batch_statistics,
                                 momentum, eps);
  }

  /// BatchNorm's output again from the statistics its forward normalised with: one affine pass
  /// y = x·α + β per channel (α = invstd·weight, β = bias − mean·α), where running the kernel in
  /// training again would first reduce over the batch (several times the pass on the CPU). The pass
  /// is torch's batch-norm kernel in eval mode with mean 0, variance 1 and eps 0 (vectorised per
  /// channel; an addcmul broadcasting α and β is slower on NCHW). α and β in at least float32, as
  /// the forward's kernel computes them for a 16-bit input. That kernel rounds in its own order
  /// (on CUDA it computes (x − mean)·invstd·w + b), so y agrees with the forward's within rounding:
  /// on the CPU, in the last bit.
  static at::Tensor normalise(const at::Tensor& input, const at::Tensor& weight,
                              const at::Tensor& bias, const at::Tensor& mean,
                              const at::Tensor& invstd) {
    const at::ScalarType type = at::promote_types(invstd.scalar_type(), at::kFloat);
    at::Tensor alpha = invstd.to(type);
    if (weight.defined()) alpha = alpha * weight.to(type);
    at::Tensor beta = -mean.to(type) * alpha;
    if (bias.defined()) beta = beta + bias.to(type);
    return std::get<0>(batch_norm(input, alpha, beta, at::zeros_like(alpha), at::ones_like(alpha),
                                  /*batch_statistics=*/false, 0.0, /*eps=*/0.0));
  }

  at::Tensor compute_producer(const std::vector<at::Tensor>& sources) const {
    switch (what) {
      case kind::layer_norm:
        return at::layer_norm(sources.at(0), normalized_shape, sources.at(1), sources.at(2), eps);
      case kind::batch_norm:
        if (!batch_statistics)
          return std::get<0>(batch_norm(sources.at(0), sources.at(1), sources.at(2), sources.at(3),
                                        sources.at(4), false, 0.0, eps));
        if (sources.size() == 5)
          return normalise(sources[0], sources[1], sources[2], sources[3], sources[4]);
        // No statistics kept: the kernel again, which recomputes them from the input (and
        // updates no running statistics).
        return std::get<0>(
            batch_norm(sources.at(0), sources.at(1), sources.at(2), {}, {}, true, 0.0, eps));
      case kind::gelu:
        return at::gelu(sources.at(0), approximate);
      case kind::silu:
        return at::silu(sources.at(0));
    }
    dropit::detail::fail("unknown producer recipe ", static_cast<std::int64_t>(what));
  }

  /// As autograd's saved data (which holds IValues only), and back.
  /// `prefix` tells apart the recipes of one function's several inputs.
  void save(::torch::autograd::AutogradContext* ctx, const std::string& prefix = "recipe") const {
    ctx->saved_data[prefix + "_kind"] = static_cast<std::int64_t>(what);
    ctx->saved_data[prefix + "_shape"] = normalized_shape;
    ctx->saved_data[prefix + "_eps"] = eps;
    ctx->saved_data[prefix + "_approximate"] = approximate;
    ctx->saved_data[prefix + "_batch_statistics"] = batch_statistics;
    ctx->saved_data[prefix + "_relu"] = relu;
  }
  static producer_recipe load(::torch::autograd::AutogradContext* ctx,
                              const std::string& prefix = "recipe") {
    producer_recipe r;
    r.what = static_cast<kind>(ctx->saved_data[prefix + "_kind"].toInt());
    r.normalized_shape = ctx->saved_data[prefix + "_shape"].toIntVector();
    r.eps = ctx->saved_data[prefix + "_eps"].toDouble();
    r.approximate = ctx->saved_data[prefix + "_approximate"].toStringRef();
    r.batch_statistics = ctx->saved_data[prefix + "_batch_statistics"].toBool();
    r.relu = ctx->saved_data[prefix + "_relu"].toBool();
    return r;
  }
};

/// A producer's output that a layer may recompute: its recipe and sources.
struct recomputable_input {
  producer_recipe recipe;
  std::vector<at::Tensor> sources;
};

using weak_tensor = c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>;

struct marked_output {
  weak_tensor output{c10::intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>()};
  std::int64_t output_version = 0;
  producer_recipe recipe;
  std::vector<weak_tensor> sources;
  std::vector<bool> source_defined;
  std::vector<std::int64_t> source_versions;
};

/// This thread's marks; entries whose output is gone are dropped at the next mark.
inline std::vector<marked_output>& marked_outputs() {
  thread_local std::vector<marked_output> marks;
  return marks;
}

/// Marks `output` as `recipe.compute(sources)`, when autograd records (a layer under no-grad
/// saves nothing anyway).
inline void mark_recomputable(const at::Tensor& output, producer_recipe recipe,
                              const std::vector<at::Tensor>& sources) {
  if (!at::GradMode::is_enabled()) return;
  auto& marks = marked_outputs();
  std::erase_if(marks, [](const marked_output& m) { return m.output.expired(); });
  marked_output m;
  m.output = weak_tensor(output.getIntrusivePtr());
  m.output_version = static_cast<std::int64_t>(output._version());
  m.recipe = std::move(recipe);
  for (const at::Tensor& source : sources) {
    m.sources.emplace_back(source.getIntrusivePtr());
    m.source_defined.push_back(source.defined());
    m.source_versions.push_back(source.defined() ? static_cast<std::int64_t>(source._version())
                                                 : 0);
  }
  marks.push_back(std::move(m));
}

/// `recipe.compute(sources)`, marked as recomputable from them: a producer's forward.
inline at::Tensor produce(producer_recipe recipe, const std::vector<at::Tensor>& sources) {
  at::Tensor output = recipe.compute(sources);
  mark_recomputable(output, std::move(recipe), sources);
  return output;
}

/// The recipe and sources of `input` when it is a marked output that neither it nor its sources
/// have changed since (and autocast is off: the layer would compute in another dtype than the
/// producer's output); otherwise none.
inline std::optional<recomputable_input> recipe_of(const at::Tensor& input) {
  if (!input.defined() || compat::autocast_dtype(input.device())) return std::nullopt;
  const auto& marks = marked_outputs();
  const auto found = std::find_if(marks.rbegin(), marks.rend(), [&](const marked_output& m) {
    return m.output._unsafe_get_target() == input.unsafeGetTensorImpl() && !m.output.expired();
  });
  if (found == marks.rend() || found->output_version != static_cast<std::int64_t>(input._version()))
    return std::nullopt;
  recomputable_input r{found->recipe, {}};
  for (std::size_t i = 0; i < found->sources.size(); ++i) {
    at::Tensor source(found->sources[i].lock());
    if (source.defined() != found->source_defined[i] ||
        (source.defined() &&
         static_cast<std::int64_t>(source._version()) != found->source_versions[i]))
      return std::nullopt;
    r.sources.push_back(std::move(source));
  }
  return r;
}

}  // namespace detail

namespace detail {

/// Saves `weight`, then the producer's sources, and the recipe: what a layer with a recomputed
/// input keeps.
inline void save_weight_and_recipe(::torch::autograd::AutogradContext* ctx,
                                   const at::Tensor& weight,
                                   const recomputable_input& recomputable) {
  recomputable.recipe.save(ctx);
  ::torch::autograd::variable_list saved{weight};
  saved.insert(saved.end(), recomputable.sources.begin(), recomputable.sources.end());
  ctx->save_for_backward(saved);
}

/// The layer's input again, from what `save_weight_and_recipe` saved (`saved` holds the weight
/// first).
inline at::Tensor recompute_input(::torch::autograd::AutogradContext* ctx,
                                  const ::torch::autograd::variable_list& saved) {
  const at::NoGradGuard no_grad;
  return producer_recipe::load(ctx).compute(
      std::vector<at::Tensor>(saved.begin() + 1, saved.end()));
}

}  // namespace detail

/// y = x Wᵀ + b for an input a producer can compute again: saves the weight and the producer's
/// sources (which the producer's own backward keeps anyway) and recomputes x for the weight
/// gradient. The sources are not inputs of this function: x's gradient flows through x.
struct RecomputedInputLinearFunction
    : public ::torch::autograd::Function<RecomputedInputLinearFunction> {
  /// `bias_argument`: the bias, or an empty tensor for none (see compat::optional_argument).
  static at::Tensor forward(::torch::autograd::AutogradContext* ctx, const at::Tensor& input,
                            const at::Tensor& weight, const at::Tensor& bias_argument,
                            const detail::recomputable_input& recomputable) {
    const at::Tensor bias = compat::from_optional_argument(bias_argument);
    detail::save_weight_and_recipe(ctx, weight, recomputable);
    return at::linear(input, weight, bias);
  }

  static ::torch::autograd::variable_list backward(::torch::autograd::AutogradContext* ctx,
                                                   ::torch::autograd::variable_list grads) {
    const ::torch::autograd::variable_list saved = ctx->get_saved_variables();
    const at::Tensor& weight = saved[0];
    const at::Tensor& dz = grads[0];
    const at::Tensor dz_rows = dz.reshape({-1, compat::static_sizes(dz).back()});
    at::Tensor d_input, d_weight, d_bias;
    if (ctx->needs_input_grad(0)) d_input = at::matmul(dz, weight);
    if (ctx->needs_input_grad(1)) {
      const at::Tensor input = detail::recompute_input(ctx, saved);
      d_weight = dz_rows.t().mm(input.reshape({-1, compat::static_sizes(input).back()}));
    }
    // A missing bias has no gradient edge: needs_input_grad(2) is false for it.
    if (ctx->needs_input_grad(2)) d_bias = dz_rows.sum(0);
    return {d_input, d_weight, d_bias, at::Tensor()};
  }
};

/// Conv2d (zero padding) for an input a producer can compute again, as the linear one above. The
/// backward is torch's own convolution backward on the recomputed input: the dense gradients.
struct RecomputedInputConv2dFunction
    : public ::torch::autograd::Function<RecomputedInputConv2dFunction> {
  static at::Tensor forward(::torch::autograd::AutogradContext* ctx, const at::Tensor& input,
                            const at::Tensor& weight, const at::Tensor& bias_argument,
                            const conv2d_params& params,
                            const detail::recomputable_input& recomputable) {
    const at::Tensor bias = compat::from_optional_argument(bias_argument);
    ctx->saved_data["input_sizes"] = compat::static_sizes(input);
    detail::save_conv2d_params(ctx, params);
    detail::save_weight_and_recipe(ctx, weight, recomputable);
    return at::conv2d(input, weight, bias, torch_pair(params.stride), torch_pair(params.padding),
                      torch_pair(params.dilation), params.groups);
  }

  static ::torch::autograd::variable_list backward(::torch::autograd::AutogradContext* ctx,
                                                   ::torch::autograd::variable_list grads) {
    const ::torch::autograd::variable_list saved = ctx->get_saved_variables();
    const at::Tensor& weight = saved[0];
    const conv2d_params params = detail::load_conv2d_params(ctx);
    const bool want_input = ctx->needs_input_grad(0), want_weight = ctx->needs_input_grad(1);
    at::Tensor d_input, d_weight, d_bias;
    if (want_weight) {
      std::tie(d_input, d_weight, std::ignore) = dense_conv2d_backward(
          grads[0], detail::recompute_input(ctx, saved), weight, params, {want_input, true, false});
    } else if (want_input) {
      d_input = conv2d_input_grad(grads[0].contiguous(), weight,
                                  ctx->saved_data["input_sizes"].toIntVector(), params);
    }
    if (ctx->needs_input_grad(2)) d_bias = grads[0].sum({0, 2, 3});
    return {d_input, d_weight, d_bias, at::Tensor(), at::Tensor()};
  }
};

}  // namespace dropit::torch
