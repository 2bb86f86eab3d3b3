#pragma once
/// @file
/// Drop-in replacements for torch::nn::Linear, torch::nn::Conv2d and torch::nn::ReLU, and for the
/// producers whose output a dropit Linear or Conv2d recomputes instead of caching (LayerNorm,
/// BatchNorm2d, GELU, SiLU; a dropit ReLU passes a producer's mark on to its own output).
/// Parameters have torch's names, shapes and initialisation (they are created by torch's own
/// layer), so state dicts load either way. In training mode with gradients enabled the layers save
/// a compact cache; in eval mode or under no-grad they run the plain dense forward and sparsify
/// nothing.

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>

#include <torch/nn.h>

#include "functions.hpp"
#include "recompute.hpp"

namespace dropit::torch {

enum class granularity_kind : std::uint8_t { element, channel };

/// The selection named by its traits' `name`: "chunked_min_k", "min_k" or "random" (the names the
/// Python package and the examples take on their command lines).
inline selection_kind selection_from_name(std::string_view name) {
  std::optional<selection_kind> found;
  [&]<class... S>(selection_list<S...>) {
    ((name == selection_traits<S>::name ? void(found = selection_traits<S>::kind) : void()), ...);
  }(selection_policies{});
  if (!found)
    dropit::detail::fail("unknown selection policy '", name, "'; expected one of ",
                         known_selections());
  return *found;
}

/// The granularity named "element" or "channel".
inline granularity_kind granularity_from_name(std::string_view name) {
  if (name == "element") return granularity_kind::element;
  if (name == "channel") return granularity_kind::channel;
  dropit::detail::fail("unknown granularity '", name, "'; expected 'element' or 'channel'");
}

/// TORCH_MODULE names `torch::nn` unqualified, which inside dropit::torch means this namespace.
#define DROPIT_TORCH_MODULE(Name)                              \
  class Name : public ::torch::nn::ModuleHolder<Name##Impl> {  \
   public:                                                     \
    using ::torch::nn::ModuleHolder<Name##Impl>::ModuleHolder; \
    using Impl = Name##Impl;                                   \
  }

namespace detail {

/// torch::nn::Conv2dImpl keeps its options in the N-d base type; rebuild the 2-d builder.
inline ::torch::nn::Conv2dOptions conv2d_options_of(
    const ::torch::nn::detail::ConvNdOptions<2>& o) {
  return ::torch::nn::Conv2dOptions(o.in_channels(), o.out_channels(), o.kernel_size())
      .stride(o.stride())
      .padding(o.padding())
      .dilation(o.dilation())
      .groups(o.groups())
      .bias(o.bias())
      .padding_mode(o.padding_mode());
}

}  // namespace detail

/// What a dropit layer keeps, as a torch-style options builder.
struct DropitOptions {
  /// The core policy for a layer whose channels lie on `channel_axis`, for forward call `call`.
  policy_spec spec(int channel_axis, std::uint64_t call) const {
    policy_spec s;
    s.selection = selection();
    s.channel_granularity = granularity() == granularity_kind::channel;
    s.channel_axis = channel_axis;
    s.gamma = gamma();
    s.chunk_size = chunk_size();
    s.seed = dropit::detail::mix64(seed() + call);
    s.rescale = rescale();
    return s;
  }

  /// Throws `dropit::error` for options no cache could be planned with.
  void validate() const { plan_cache(spec(0, 0), dropit::shape{1}, element_type::float32); }

  /// Fraction of the cached input to drop, in [0, 1).
  TORCH_ARG(double, gamma) = 0.9;
  TORCH_ARG(selection_kind, selection) = selection_kind::chunked_min_k;
  TORCH_ARG(granularity_kind, granularity) = granularity_kind::element;
  /// Chunk length D of chunked min-k and random selection, in [1, 65536].
  TORCH_ARG(std::int64_t, chunk_size) = default_chunk_size;
  /// Seed of random selection; each forward call draws afresh from (seed, call number).
  TORCH_ARG(std::uint64_t, seed) = 0;
  /// Scale kept values by n/k for random selection.
  TORCH_ARG(bool, rescale) = false;
  /// A Linear or Conv2d whose input is the untouched output of a dropit producer (LayerNorm,
  /// BatchNorm2d, GELU, SiLU, each optionally followed by a dropit ReLU) recomputes it in backward
  /// instead of caching it: exact, and nothing held of its own. `convert` swaps torch's producers
  /// for dropit's when this is on.
  TORCH_ARG(bool, recompute) = true;
  /// Recompute through layers too. A Linear or Conv2d whose input it recomputes or keeps as it is
  /// (`keep_input`) marks its own output as recomputable (its forward again), and a dropit producer
  /// reading that output with its `recompute_layers` on (as `convert` sets it from this) keeps none
  /// of it: backward runs the chain again (BatchNorm2d after such a Conv2d, GELU after such a
  /// Linear). It frees the producer's input for one more forward of the layer in backward, run once
  /// for all the layers reading the producer's output; a chain runs two layers on recomputed inputs
  /// at most (a residual body's two convolutions), so that what it computes ahead stays in a block.
  /// The gradients upstream of the producer then agree with dense within rounding. On a Linear or
  /// Conv2d it also recomputes an input that is another layer's output directly (that layer's
  /// forward again) instead of caching it. Off by default; the memory planner turns it on per
  /// block.
  TORCH_ARG(bool, recompute_layers) = false;
  /// Keep the input as it is, as torch's layer does: no cache, torch's gradients. For a layer whose
  /// input stays alive anyway, the model's own (`convert`'s skip_first sets it on the first layer):
  /// its output is then recomputable from that input, so that a producer after it can keep none of
  /// its input (`recompute_layers`), as the BatchNorm after a network's first convolution.
  TORCH_ARG(bool, keep_input) = false;
  /// Cache, as DropIT does, an input the layer cannot recompute. Off: keep such an input as it
  /// is, as torch's layer does (`keep_input` wherever `recompute` finds nothing to recompute):
  /// exact gradients throughout, the memory saved by recomputation alone.
  TORCH_ARG(bool, cache) = true;
};

namespace detail {

/// What a layer keeps of its input, in its printed form.
inline void print_kept(std::ostream& stream, const DropitOptions& dropit) {
  if (dropit.keep_input())
    stream << ", keep_input=true";
  else if (!dropit.cache())
    stream << ", cache=false";
  else
    stream << ", gamma=" << dropit.gamma();
}

}  // namespace detail

/// torch::nn::Linear that caches its input compactly.
class LinearImpl : public ::torch::nn::Cloneable<LinearImpl> {
 public:
  LinearImpl(std::int64_t in_features, std::int64_t out_features)
      : LinearImpl(::torch::nn::LinearOptions(in_features, out_features)) {}
  explicit LinearImpl(const ::torch::nn::LinearOptions& options, DropitOptions dropit = {})
      : options(options), dropit(std::move(dropit)) {
    reset();
  }
  /// Takes over the parameters of an existing dense layer (they stay shared with it).
  LinearImpl(const ::torch::nn::LinearImpl& dense, DropitOptions dropit)
      : options(dense.options), dropit(std::move(dropit)) {
    this->dropit.validate();
    adopt(dense.weight, dense.bias);
    train(dense.is_training());
  }

  void reset() override {
    dropit.validate();
    ::torch::nn::Linear reference(options);  // torch's own initialisation
    adopt(reference->weight, reference->bias);
  }

  at::Tensor forward(const at::Tensor& input) {
    if (is_training() && ::torch::GradMode::is_enabled() && weight.requires_grad()) {
      if (!dropit.keep_input() && dropit.recompute())
        if (const auto recomputable = detail::recipe_of(input, dropit.recompute_layers()))
          return detail::layer_on_recomputed_input(
              *recomputable, detail::layer_recipe(detail::producer_recipe::kind::linear), weight,
              bias, [&](const detail::recomputable_input& saved) {
                return RecomputedInputLinearFunction::apply(input, weight, bias, saved);
              });
      if (dropit.keep_input() || !dropit.cache())
        return detail::produce(detail::layer_recipe(detail::producer_recipe::kind::linear),
                               {input, weight, bias});
      const auto [x, w, b] = autocast_layer_inputs(input, input, weight, bias);
      return LinearFunction::apply(x, w, b, dropit.spec(-1, calls_++));
    }
    return at::linear(input, weight, bias);
  }

  void pretty_print(std::ostream& stream) const override {
    stream << "dropit::torch::Linear(in_features=" << options.in_features()
           << ", out_features=" << options.out_features() << ", bias=" << options.bias();
    detail::print_kept(stream, dropit);
    stream << ")";
  }

  ::torch::nn::LinearOptions options;
  DropitOptions dropit;
  at::Tensor weight, bias;

 private:
  void adopt(const at::Tensor& w, const at::Tensor& b) {
    weight = register_parameter("weight", w);
    bias = register_parameter("bias", b, /*requires_grad=*/b.defined());
  }
  std::uint64_t calls_ = 0;
};
DROPIT_TORCH_MODULE(Linear);

/// torch::nn::Conv2d (zero padding) that caches its input compactly.
class Conv2dImpl : public ::torch::nn::Cloneable<Conv2dImpl> {
 public:
  explicit Conv2dImpl(const ::torch::nn::Conv2dOptions& options, DropitOptions dropit = {})
      : options(options), dropit(std::move(dropit)) {
    reset();
  }
  Conv2dImpl(const ::torch::nn::Conv2dImpl& dense, DropitOptions dropit)
      : options(detail::conv2d_options_of(dense.options)), dropit(std::move(dropit)) {
    check_options();
    adopt(dense.weight, dense.bias);
    train(dense.is_training());
  }

  void reset() override {
    check_options();
    ::torch::nn::Conv2d reference(options);
    adopt(reference->weight, reference->bias);
  }

  at::Tensor forward(const at::Tensor& input) {
    if (is_training() && ::torch::GradMode::is_enabled() && weight.requires_grad()) {
      if (!dropit.keep_input() && dropit.recompute())
        if (const auto recomputable = detail::recipe_of(input, dropit.recompute_layers()))
          return detail::layer_on_recomputed_input(
              *recomputable, detail::layer_recipe(detail::producer_recipe::kind::conv2d, params_),
              weight, bias, [&](const detail::recomputable_input& saved) {
                return RecomputedInputConv2dFunction::apply(input, weight, bias, params_,
                                                            saved);
              });
      if (dropit.keep_input() || !dropit.cache())
        return detail::produce(detail::layer_recipe(detail::producer_recipe::kind::conv2d, params_),
                               {input, weight, bias});
      const auto [x, w, b] = autocast_layer_inputs(input, input, weight, bias);
      return Conv2dFunction::apply(x, w, b, params_, dropit.spec(1, calls_++));
    }
    return at::conv2d(input, weight, bias, torch_pair(params_.stride), torch_pair(params_.padding),
                      torch_pair(params_.dilation), params_.groups);
  }

  void pretty_print(std::ostream& stream) const override {
    stream << "dropit::torch::Conv2d(" << options.in_channels() << ", " << options.out_channels()
           << ", kernel_size=" << options.kernel_size() << ", stride=" << options.stride();
    detail::print_kept(stream, dropit);
    stream << ")";
  }

  ::torch::nn::Conv2dOptions options;
  DropitOptions dropit;
  at::Tensor weight, bias;

 private:
  void check_options() {
    dropit.validate();
    dropit::detail::expect(
        compat::holds_alternative<::torch::enumtype::kZeros>(options.padding_mode()),
        "dropit::torch::Conv2d supports padding_mode zeros only");
    const auto& padding = options.padding();
    if (const auto* explicit_padding = compat::get_if<::torch::ExpandingArray<2>>(&padding)) {
      params_.padding[0] = (**explicit_padding)[0];
      params_.padding[1] = (**explicit_padding)[1];
    } else {
      dropit::detail::expect(compat::holds_alternative<::torch::enumtype::kValid>(padding),
                             "dropit::torch::Conv2d needs explicit or 'valid' padding; "
                             "compute the 'same' padding for your kernel and pass it");
      params_.padding[0] = params_.padding[1] = 0;
    }
    for (int i = 0; i < 2; ++i) {
      params_.stride[i] = (*options.stride())[i];
      params_.dilation[i] = (*options.dilation())[i];
    }
    params_.groups = options.groups();
  }
  void adopt(const at::Tensor& w, const at::Tensor& b) {
    weight = register_parameter("weight", w);
    bias = register_parameter("bias", b, /*requires_grad=*/b.defined());
  }
  conv2d_params params_{};
  std::uint64_t calls_ = 0;
};
DROPIT_TORCH_MODULE(Conv2d);

/// ReLU that keeps a 1-bit mask for backward instead of its output. Applied to a producer's
/// untouched output (BatchNorm2d's, say), its own output is recomputable too: the producer's
/// recipe, then this ReLU.
class ReLUImpl : public ::torch::nn::Cloneable<ReLUImpl> {
 public:
  ReLUImpl() = default;
  void reset() override {}

  at::Tensor forward(const at::Tensor& input) {
    if (!::torch::GradMode::is_enabled() || !input.requires_grad()) return at::relu(input);
    at::Tensor output = ReLUFunction::apply(input);
    if (auto recomputable = detail::recipe_of(input, /*through_layers=*/true);
        recomputable && !recomputable->recipe.relu) {
      recomputable->recipe.relu = true;
      detail::mark_recomputable(output, std::move(recomputable->recipe), recomputable->sources);
    }
    return output;
  }

  void pretty_print(std::ostream& stream) const override { stream << "dropit::torch::ReLU()"; }
};
DROPIT_TORCH_MODULE(ReLU);

/// torch::nn::LayerNorm whose output a dropit Linear reading it recomputes instead of caching.
class LayerNormImpl : public ::torch::nn::Cloneable<LayerNormImpl> {
 public:
  explicit LayerNormImpl(const ::torch::nn::LayerNormOptions& options) : options(options) {
    reset();
  }
  /// Takes over the parameters of an existing torch layer (they stay shared with it).
  explicit LayerNormImpl(const ::torch::nn::LayerNormImpl& dense) : options(dense.options) {
    adopt(dense.weight, dense.bias);
    train(dense.is_training());
  }

  void reset() override {
    ::torch::nn::LayerNorm reference(options);
    adopt(reference->weight, reference->bias);
  }

  at::Tensor forward(const at::Tensor& input) {
    detail::producer_recipe recipe;
    recipe.what = detail::producer_recipe::kind::layer_norm;
    recipe.normalized_shape = options.normalized_shape();
    recipe.eps = options.eps();
    return detail::produce(std::move(recipe), {input, weight, bias}, recompute_layers);
  }

  void pretty_print(std::ostream& stream) const override {
    stream << "dropit::torch::LayerNorm(" << options.normalized_shape() << ", eps=" << options.eps()
           << ")";
  }

  ::torch::nn::LayerNormOptions options;
  at::Tensor weight, bias;
  /// Keep none of an input a layer can recompute (DropitOptions::recompute_layers).
  bool recompute_layers = false;

 private:
  void adopt(const at::Tensor& w, const at::Tensor& b) {
    weight = register_parameter("weight", w, /*requires_grad=*/w.defined());
    bias = register_parameter("bias", b, /*requires_grad=*/b.defined());
  }
};
DROPIT_TORCH_MODULE(LayerNorm);

/// torch::nn::BatchNorm2d whose output (or a dropit ReLU's of it) a dropit Conv2d or Linear reading
/// it recomputes instead of caching. Parameters and running statistics are torch's (shared with
/// the layer it was made from); the forward is torch's batch-norm kernel, the one
/// torch::nn::BatchNorm2d reaches on the CPU (on CUDA it reaches cuDNN's instead).
class BatchNorm2dImpl : public ::torch::nn::Cloneable<BatchNorm2dImpl> {
 public:
  explicit BatchNorm2dImpl(const ::torch::nn::BatchNormOptions& options) : options(options) {
    reset();
  }
  /// Takes over the parameters and buffers of an existing torch layer (they stay shared with it).
  explicit BatchNorm2dImpl(const ::torch::nn::BatchNorm2dImpl& dense) : options(dense.options) {
    adopt(dense.weight, dense.bias, dense.running_mean, dense.running_var,
          dense.num_batches_tracked);
    train(dense.is_training());
  }

  void reset() override {
    ::torch::nn::BatchNorm2d reference(options);
    adopt(reference->weight, reference->bias, reference->running_mean, reference->running_var,
          reference->num_batches_tracked);
  }

  at::Tensor forward(const at::Tensor& input) {
    dropit::detail::expect(input.dim() == 4, "dropit::torch::BatchNorm2d expects a 4-d input [N, ",
                           options.num_features(), ", H, W], got ", input.dim(), " dimensions");
    // As torch::nn::BatchNorm2d: a momentum of none averages over every batch seen.
    double momentum = options.momentum().value_or(0.0);
    if (is_training() && options.track_running_stats() && num_batches_tracked.defined()) {
      num_batches_tracked += 1;
      if (!options.momentum()) momentum = 1.0 / num_batches_tracked.item<double>();
    }
    detail::producer_recipe recipe;
    recipe.what = detail::producer_recipe::kind::batch_norm;
    recipe.eps = options.eps();
    recipe.batch_statistics = is_training() || !options.track_running_stats();
    if (const auto through_layer = detail::input_through_layer(recompute_layers, input))
      return detail::produce_recomputing_input(
          producer_call(recipe, running_mean, running_var, momentum), input, weight, bias,
          *through_layer);
    const auto [output, mean, invstd] =
        detail::producer_recipe::batch_norm(input, weight, bias, running_mean, running_var,
                                            recipe.batch_statistics, momentum, options.eps());
    // The recomputation normalises with what this forward did: the running statistics, or the
    // batch's, which torch's backward of this kernel keeps alive (with no autograd node, nothing
    // does: the recomputation runs the kernel again).
    std::vector<at::Tensor> sources{input, weight, bias};
    if (!recipe.batch_statistics)
      sources.insert(sources.end(), {running_mean, running_var});
    else if (output.requires_grad())
      sources.insert(sources.end(), {mean, invstd});
    detail::mark_recomputable(output, std::move(recipe), sources);
    return output;
  }

  void pretty_print(std::ostream& stream) const override {
    stream << "dropit::torch::BatchNorm2d(" << options.num_features() << ", eps=" << options.eps()
           << ")";
  }

  ::torch::nn::BatchNormOptions options;
  at::Tensor weight, bias, running_mean, running_var, num_batches_tracked;
  /// Keep none of an input a layer can recompute (DropitOptions::recompute_layers).
  bool recompute_layers = false;

 private:
  void adopt(const at::Tensor& w, const at::Tensor& b, const at::Tensor& mean,
             const at::Tensor& var, const at::Tensor& batches) {
    weight = register_parameter("weight", w, /*requires_grad=*/w.defined());
    bias = register_parameter("bias", b, /*requires_grad=*/b.defined());
    running_mean = register_buffer("running_mean", mean);
    running_var = register_buffer("running_var", var);
    num_batches_tracked = register_buffer("num_batches_tracked", batches);
  }
};
DROPIT_TORCH_MODULE(BatchNorm2d);

/// torch::nn::GELU whose output a dropit Linear reading it recomputes instead of caching.
class GELUImpl : public ::torch::nn::Cloneable<GELUImpl> {
 public:
  explicit GELUImpl(std::string approximate = "none") : approximate(std::move(approximate)) {}
  explicit GELUImpl(const ::torch::nn::GELUImpl& dense) : GELUImpl(dense.options.approximate()) {
    train(dense.is_training());
  }
  void reset() override {}

  at::Tensor forward(const at::Tensor& input) {
    detail::producer_recipe recipe;
    recipe.what = detail::producer_recipe::kind::gelu;
    recipe.approximate = approximate;
    return detail::produce(std::move(recipe), {input}, recompute_layers);
  }

  void pretty_print(std::ostream& stream) const override {
    stream << "dropit::torch::GELU(approximate=" << approximate << ")";
  }

  std::string approximate;
  /// Keep none of an input a layer can recompute (DropitOptions::recompute_layers).
  bool recompute_layers = false;
};
DROPIT_TORCH_MODULE(GELU);

/// torch::nn::SiLU whose output a dropit Linear reading it recomputes instead of caching.
class SiLUImpl : public ::torch::nn::Cloneable<SiLUImpl> {
 public:
  SiLUImpl() = default;
  void reset() override {}

  at::Tensor forward(const at::Tensor& input) {
    detail::producer_recipe recipe;
    recipe.what = detail::producer_recipe::kind::silu;
    return detail::produce(std::move(recipe), {input}, recompute_layers);
  }

  void pretty_print(std::ostream& stream) const override { stream << "dropit::torch::SiLU()"; }

  /// Keep none of an input a layer can recompute (DropitOptions::recompute_layers).
  bool recompute_layers = false;
};
DROPIT_TORCH_MODULE(SiLU);

}  // namespace dropit::torch
