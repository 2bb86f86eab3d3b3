#pragma once
/// @file
/// Softmax attention, softmax(q kᵀ / √d) v, that keeps q, k and v for backward and computes the
/// probabilities again there, instead of keeping them: the probabilities are batch × heads ×
/// tokens² elements per layer, often more than q, k and v together, and computing them again costs
/// one batched matmul and one softmax. Backward runs the forward's own operations (the same
/// matmul, division and softmax kernels), so the probabilities and the gradients are the ones
/// torch's autograd computes for those operations.
///
/// `SoftmaxAttention` is the module form: with `recompute(false)` it is torch's operations (the
/// dense attention, which keeps the probabilities), and `convert` makes such a module recompute,
/// as it swaps producers, where it is held by a torch::nn::Sequential.

#include <array>
#include <cmath>
#include <cstdint>
#include <optional>
#include <ostream>
#include <utility>
#include <vector>

#include <torch/autograd.h>

#include "../config.hpp"
#include "compat.hpp"
#include "modules.hpp"
#include "recompute.hpp"

namespace dropit::torch {
namespace detail {

/// torch's operations for softmax attention, softmax(q kᵀ / √d) v: the dense form, whose autograd
/// keeps the probabilities.
inline at::Tensor dense_softmax_attention(const at::Tensor& q, const at::Tensor& k,
                                          const at::Tensor& v) {
  const double divisor = std::sqrt(static_cast<double>(q.size(-1)));
  return at::matmul((at::matmul(q, k.transpose(-2, -1)) / divisor).softmax(-1), v);
}

/// q, k and v as views of one layer output that `recipe` computes again.
struct attention_through_layer {
  recomputable_input recipe;
  at::Tensor base;  // the tensor q, k and v view (the output, or all of what it views)
};

/// Where q, k and v lie in the tensor they view: what backward needs to take them again from that
/// tensor computed again.
struct attention_views {
  struct view {
    std::vector<std::int64_t> sizes, strides;
    std::int64_t offset = 0;  // from the base's own storage offset
  };
  std::vector<std::int64_t> base_sizes;
  view q, k, v;
};

/// Checks q [..., Tq, d], k [..., Tk, d], v [..., Tk, dv]: the same leading axes, dtype and device.
inline void check_attention_operands(const at::Tensor& q, const at::Tensor& k,
                                     const at::Tensor& v) {
  using dropit::detail::expect;
  expect(q.defined() && k.defined() && v.defined(),
         "softmax_attention: q, k and v must be defined tensors");
  expect(q.dim() >= 2, "softmax_attention: q has ", q.dim(),
         " dimension(s); expected at least 2 ([..., tokens, features])");
  expect(k.dim() == q.dim() && v.dim() == q.dim(), "softmax_attention: q, k and v have ", q.dim(),
         ", ", k.dim(), " and ", v.dim(), " dimensions; expected the same number");
  const std::vector<std::int64_t> qs = compat::static_sizes(q), ks = compat::static_sizes(k),
                                  vs = compat::static_sizes(v);
  const std::size_t n = qs.size();
  for (std::size_t axis = 0; axis + 2 < n; ++axis)
    expect(qs[axis] == ks[axis] && qs[axis] == vs[axis], "softmax_attention: axis ", axis,
           " has sizes ", qs[axis], " (q), ", ks[axis], " (k) and ", vs[axis],
           " (v); expected the same leading axes (no broadcasting)");
  expect(qs[n - 1] == ks[n - 1], "softmax_attention: q has ", qs[n - 1], " features and k ",
         ks[n - 1], "; expected the same");
  expect(ks[n - 2] == vs[n - 2], "softmax_attention: k has ", ks[n - 2], " tokens and v ",
         vs[n - 2], "; expected the same");
  expect(q.scalar_type() == k.scalar_type() && q.scalar_type() == v.scalar_type(),
         "softmax_attention: q, k and v have dtypes ", q.scalar_type(), ", ", k.scalar_type(),
         " and ", v.scalar_type(), "; expected one dtype");
  expect(q.is_floating_point(), "softmax_attention: dtype ", q.scalar_type(),
         " is not a floating-point type");
  expect(q.device() == k.device() && q.device() == v.device(),
         "softmax_attention: q, k and v are on ", q.device(), ", ", k.device(), " and ", v.device(),
         "; expected one device");
}

}  // namespace detail

/// Softmax attention keeping q, k and v (saved as they are: views keep their base alive) and
/// computing the probabilities again in backward. Forward and backward run the batched matrix
/// products torch's matmul runs for the dense form (operands folded to [batch, rows, columns]) and
/// the gradients torch's backward of each operation computes, so results equal the dense form's
/// bit for bit.
struct SoftmaxAttentionFunction : public ::torch::autograd::Function<SoftmaxAttentionFunction> {
  /// q [n, Tq, d], kᵀ [n, d, Tk] and v [n, Tk, dv]: the operands of the two batched products.
  struct folded {
    at::Tensor q, k_t, v;
    folded(const at::Tensor& q4, const at::Tensor& k4, const at::Tensor& v4)
        : q(q4.reshape({-1, q4.size(-2), q4.size(-1)})),
          k_t(k4.transpose(-2, -1).reshape({-1, k4.size(-1), k4.size(-2)})),
          v(v4.reshape({-1, v4.size(-2), v4.size(-1)})) {}
    at::Tensor probabilities() const {
      return (at::bmm(q, k_t) / std::sqrt(static_cast<double>(q.size(-1)))).softmax(-1);
    }
  };

  static std::vector<std::int64_t> output_sizes(const at::Tensor& q, const at::Tensor& v) {
    std::vector<std::int64_t> sizes = compat::static_sizes(q);
    sizes.back() = v.size(-1);
    return sizes;
  }

  /// With `through_layer`, q, k and v are views of a tensor that its recipe computes again (a
  /// projection's output): saves the recipe's sources and the views' geometry instead of q, k, v.
  static at::Tensor forward(::torch::autograd::AutogradContext* ctx, const at::Tensor& q,
                            const at::Tensor& k, const at::Tensor& v,
                            const std::optional<detail::attention_through_layer>& through_layer) {
    if (through_layer) {
      through_layer->recipe.recipe.save(ctx);
      ctx->save_for_backward(through_layer->recipe.sources);
      const at::Tensor& base = through_layer->base;
      const auto where = [&](const at::Tensor& view) {
        return detail::attention_views::view{
            compat::static_sizes(view), view.strides().vec(),
            static_cast<std::int64_t>(view.storage_offset() - base.storage_offset())};
      };
      detail::save_value(
          ctx, "views",
          detail::attention_views{compat::static_sizes(base), where(q), where(k), where(v)});
    } else {
      ctx->save_for_backward({q, k, v});
    }
    const folded f(q, k, v);
    return at::bmm(f.probabilities(), f.v).view(output_sizes(q, v));
  }

  /// q, k and v again: as saved, or as views of their base computed again.
  static std::array<at::Tensor, 3> operands(::torch::autograd::AutogradContext* ctx,
                                            const ::torch::autograd::variable_list& saved) {
    if (ctx->saved_data.find("views") == ctx->saved_data.end())
      return {saved[0], saved[1], saved[2]};
    at::Tensor output;
    {
      const at::NoGradGuard no_grad;
      output = detail::producer_recipe::load(ctx).take_or_compute(saved);
    }
    const auto& views = detail::load_value<detail::attention_views>(ctx, "views");
    // The base is contiguous and the output all of it, in the same order (marked_output::root).
    const at::Tensor base = output.contiguous().view(views.base_sizes);
    const auto view = [&](const detail::attention_views::view& v) {
      return base.as_strided(v.sizes, v.strides, base.storage_offset() + v.offset);
    };
    return {view(views.q), view(views.k), view(views.v)};
  }

  static ::torch::autograd::variable_list backward(::torch::autograd::AutogradContext* ctx,
                                                   ::torch::autograd::variable_list grads) {
    const auto [q, k, v] = operands(ctx, ctx->get_saved_variables());
    const folded f(q, k, v);
    const at::Tensor p = f.probabilities();
    const at::Tensor d_output = grads[0].reshape({-1, q.size(-2), v.size(-1)});
    at::Tensor dq, dk, dv;
    if (ctx->needs_input_grad(2))
      dv = p.transpose(1, 2).bmm(d_output).view(compat::static_sizes(v));
    if (ctx->needs_input_grad(0) || ctx->needs_input_grad(1)) {
      // The gradients of softmax and of the division by √d, as torch's backward of each.
      const at::Tensor d_scores =
          at::_softmax_backward_data(d_output.bmm(f.v.transpose(1, 2)), p, -1, p.scalar_type()) /
          std::sqrt(static_cast<double>(q.size(-1)));
      if (ctx->needs_input_grad(0))
        dq = d_scores.bmm(f.k_t.transpose(1, 2)).view(compat::static_sizes(q));
      if (ctx->needs_input_grad(1)) {
        std::vector<std::int64_t> k_t_sizes = compat::static_sizes(k);
        std::swap(k_t_sizes[k_t_sizes.size() - 1], k_t_sizes[k_t_sizes.size() - 2]);
        dk = f.q.transpose(1, 2).bmm(d_scores).view(k_t_sizes).transpose(-2, -1);
      }
    }
    return {dq, dk, dv, at::Tensor()};
  }
};

namespace detail {

/// The recipe of the layer output that q, k and v are views of, where `recompute_layers` is on
/// and a layer computes that output again from a producer's sources (a fused q, k, v projection
/// after LayerNorm): then the attention keeps none of q, k and v either. The output itself may be
/// gone (a caller keeps only the views): the mark is found through the tensor the views share.
inline std::optional<attention_through_layer> attention_base_through_layer(bool recompute_layers,
                                                                           const at::Tensor& q,
                                                                           const at::Tensor& k,
                                                                           const at::Tensor& v) {
  if (!recompute_layers || !q.is_view()) return std::nullopt;
  const at::Tensor root = root_of(q);
  if (!root_of(k).is_same(root) || !root_of(v).is_same(root)) return std::nullopt;
  auto recomputable = recipe_of_root(root, /*through_layers=*/true);
  if (!recomputable || !recomputable->recipe.runs_layer()) return std::nullopt;
  return attention_through_layer{std::move(*recomputable), root};
}

}  // namespace detail

/// softmax(q kᵀ / √d) v for q [..., Tq, d], k [..., Tk, d], v [..., Tk, dv] (the same leading
/// axes, e.g. [batch, heads]): recomputing the probabilities in backward where autograd records
/// and autocast is off; torch's operations otherwise (under autocast, as torch's would cast them).
/// With `recompute_layers`, where q, k and v are views of one output a layer computes again from
/// a producer's sources (DropitOptions::recompute_layers), it keeps none of them either and runs
/// that layer again in backward. With `only_through_layers`, it recomputes the probabilities only
/// there, and elsewhere is torch's operations (SoftmaxAttentionOptions::only_through_layers).
inline at::Tensor softmax_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                    bool recompute_layers = false,
                                    bool only_through_layers = false) {
  detail::check_attention_operands(q, k, v);
  const bool records =
      at::GradMode::is_enabled() && (q.requires_grad() || k.requires_grad() || v.requires_grad());
  if (!records || compat::autocast_dtype(q.device()))
    return detail::dense_softmax_attention(q, k, v);
  auto through_layer = detail::attention_base_through_layer(recompute_layers, q, k, v);
  if (!through_layer && only_through_layers) return detail::dense_softmax_attention(q, k, v);
  return SoftmaxAttentionFunction::apply(q, k, v, std::move(through_layer));
}

struct SoftmaxAttentionOptions {
  /// Compute the probabilities again in backward (softmax_attention) rather than keep them
  /// (torch's operations).
  TORCH_ARG(bool, recompute) = true;
  /// Recompute the probabilities only where q, k and v are computed again too, through the layer
  /// that projects them (recompute_layers), and keep them elsewhere, as torch's operations do. For
  /// short sequences: their probabilities are few bytes beside q, k and v, and computing them again
  /// costs a batched product of many small matrices and a softmax.
  TORCH_ARG(bool, only_through_layers) = false;
};

/// Softmax attention as a module (no parameters): forward(q, k, v). convert turns one with
/// recompute(false) into one that recomputes (DropitOptions::recompute).
class SoftmaxAttentionImpl : public ::torch::nn::Cloneable<SoftmaxAttentionImpl> {
 public:
  explicit SoftmaxAttentionImpl(const SoftmaxAttentionOptions& options = {}) : options(options) {}

  void reset() override {}

  at::Tensor forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
    if (options.recompute())
      return softmax_attention(q, k, v, recompute_layers, options.only_through_layers());
    detail::check_attention_operands(q, k, v);
    return detail::dense_softmax_attention(q, k, v);
  }

  void pretty_print(std::ostream& stream) const override {
    stream << "dropit::torch::SoftmaxAttention(recompute=" << options.recompute()
           << ", only_through_layers=" << options.only_through_layers() << ")";
  }

  SoftmaxAttentionOptions options;
  /// Keep none of q, k and v where a layer can compute them again
  /// (DropitOptions::recompute_layers; `convert` sets it).
  bool recompute_layers = false;
};

DROPIT_TORCH_MODULE(SoftmaxAttention);

}  // namespace dropit::torch
