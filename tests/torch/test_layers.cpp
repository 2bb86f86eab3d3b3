// dropit::torch::Linear, Conv2d and ReLU against torch's own layers and autograd on dense tensors.
//
// γ = 0: output, input gradient, weight and bias gradients equal those of torch::nn::Linear /
// Conv2d holding the same parameters. γ > 0: the weight gradient equals torch's dense formula
// applied to the densified cache (the same input compressed under the spec the layer used), the
// input gradient still equals the dense one (full weight), the bias gradient equals torch's.

#include <limits>
#include <string>
#include <vector>

#include "torch_helpers.hpp"

namespace {

using namespace torch_test;
using dropit::selection_kind;
using dt::DropitOptions;
using dt::granularity_kind;

/// Float32 summation over at most a few thousand terms, in any order: well inside 2e-5 · Σ|terms|.
constexpr double float_rel = 2e-5;
/// A bfloat16 result summed in float and rounded once: half an ulp, at most 2^-8 of |result|.
constexpr double bf16_round = 1.0 / 256;

/// A float32 copy of `layer` (torch's own layer type), for the reference computation.
template <class Layer>
Layer float_copy(const Layer& layer) {
  Layer copy(std::dynamic_pointer_cast<typename Layer::Impl>(layer->clone()));
  copy->to(at::kFloat);
  return copy;
}

/// Σ|terms| of the output and of each gradient of a layer `f(x, w, b)`: the same computation
/// on float32 copies of the absolute values of every operand and of the upstream gradient.
template <class F>
forward_backward magnitude_bound(F&& f, const at::Tensor& x, const at::Tensor& w,
                                 const at::Tensor& b, const at::Tensor& upstream) {
  auto leaf = [](const at::Tensor& t) {
    return t.defined() ? t.detach().to(at::kFloat).abs().requires_grad_() : at::Tensor();
  };
  const at::Tensor xa = leaf(x), wa = leaf(w), ba = leaf(b);
  return run([&] { return f(xa, wa, ba); }, upstream.to(at::kFloat).abs(), {xa, wa, ba});
}

/// `mine` against torch. float32: everything against torch's float32 layer (`want`). bfloat16:
/// the forward and dX are torch's own bf16 kernels (at::linear / at::conv2d, matmul / transposed
/// convolution), so they are checked against torch's bf16 layer (`same_type`), whose kernel choice
/// may differ (grad mode is off inside an autograd function) and round intermediate sums (x·Wᵀ,
/// then + b): each rounding is within 2^-8 of Σ|terms|, so within 2^-7 of it. db is torch's bf16
/// sum of dZ, checked the same way. dW is dropit's own float sum rounded once, checked against the
/// float32 reference to half an ulp.
void check_against(const forward_backward& mine, const forward_backward& want,
                   const forward_backward& same_type, const forward_backward& bound) {
  const auto type = mine.output.scalar_type();
  const bool bf16 = type == at::kBFloat16;
  if (bf16) {
    check_close(mine.output, same_type.output, bound.output, 2 * bf16_round, "output");
    check_close(mine.grads[0], same_type.grads[0], bound.grads[0], 2 * bf16_round,
                "input gradient");
  } else {
    check_close(mine.output, want.output, bound.output, float_rel, "output");
    check_close(mine.grads[0], want.grads[0], bound.grads[0], float_rel, "input gradient");
  }
  check_close(mine.grads[1], want.grads[1].to(type), bound.grads[1], float_rel, "weight gradient",
              bf16 ? bf16_round : 0.0);
  CHECK(mine.grads[2].defined() == want.grads[2].defined());
  if (!mine.grads[2].defined()) return;
  if (bf16)
    check_close(mine.grads[2], same_type.grads[2], bound.grads[2], 2 * bf16_round, "bias gradient");
  else
    check_close(mine.grads[2], want.grads[2], bound.grads[2], float_rel, "bias gradient");
}

bool is_dropit_node(const at::Tensor& t) {
  return grad_fn_name(t).find("dropit") != std::string::npos;
}

struct linear_case {
  std::vector<std::int64_t> input;
  std::int64_t out;
  bool bias;
};

const std::vector<linear_case> linear_cases = {
    {{7, 5}, 3, true}, {{4, 6, 9}, 5, false}, {{2, 3, 17}, 33, true},
    {{1, 1}, 1, true}, {{64, 40}, 24, true},  {{300, 19}, 7, false},
};

struct conv_case {
  std::vector<std::int64_t> input;  // N, C, H, W
  ::torch::nn::Conv2dOptions options;
};

const std::vector<conv_case> conv_cases = {
    {{2, 3, 8, 8}, ::torch::nn::Conv2dOptions(3, 8, 3).padding(1)},
    {{3, 4, 9, 10},
     ::torch::nn::Conv2dOptions(4, 6, {3, 5}).stride({2, 1}).padding({1, 2}).bias(false)},
    {{2, 8, 7, 7}, ::torch::nn::Conv2dOptions(8, 8, 3).padding(1).groups(8)},  // depthwise
    {{1, 6, 11, 9}, ::torch::nn::Conv2dOptions(6, 4, 3).stride(2).padding(2).dilation(2).groups(2)},
    {{2, 4, 8, 8}, ::torch::nn::Conv2dOptions(4, 4, 1).stride(2)},  // 1x1 downsample
    {{2, 2, 11, 9},
     ::torch::nn::Conv2dOptions(2, 3, {2, 3}).stride({3, 2}).padding({0, 1}).dilation({1, 2})},
    {{1, 3, 5, 6}, ::torch::nn::Conv2dOptions(3, 2, {5, 1}).bias(false)},  // kernel = height
};

std::vector<std::int64_t> linear_output_shape(std::vector<std::int64_t> input, std::int64_t out) {
  input.back() = out;
  return input;
}

}  // namespace

namespace {

/// γ = 0 against torch's own layer: the dropit layer is built from it (sharing its parameters);
/// the reference is a float32 copy of torch's layer run by torch's autograd on the same values.
void check_linear_gamma0(const linear_case& c, at::ScalarType dtype, std::uint64_t seed) {
  ::torch::manual_seed(seed);
  ::torch::nn::Linear dense(::torch::nn::LinearOptions(c.input.back(), c.out).bias(c.bias));
  dense->to(dtype);
  dt::Linear ours(*dense, DropitOptions().gamma(0));
  CHECK(ours->weight.is_same(dense->weight));
  const at::Tensor x = ::torch::randn(c.input).to(dtype).requires_grad_();
  const at::Tensor g = ::torch::randn(linear_output_shape(c.input, c.out)).to(dtype);

  const auto mine = run([&] { return ours(x); }, g, {x, ours->weight, ours->bias});
  CHECK(is_dropit_node(mine.output));
  auto dense_f = float_copy(dense);
  const at::Tensor xf = x.detach().to(at::kFloat).requires_grad_();
  const auto want =
      run([&] { return dense_f(xf); }, g.to(at::kFloat), {xf, dense_f->weight, dense_f->bias});
  const auto bound = magnitude_bound(
      [](auto x, auto w, auto b) { return ::torch::nn::functional::linear(x, w, b); }, x,
      dense->weight, dense->bias, g);
  const at::Tensor xs = x.detach().requires_grad_();
  const auto same_type = run([&] { return dense(xs); }, g, {xs, dense->weight, dense->bias});
  // In float32 the forward is torch's own, bit for bit.
  if (dtype == at::kFloat) CHECK(same_values(mine.output, same_type.output));
  check_against(mine, want, same_type, bound);
}

void check_conv_gamma0(const conv_case& c, at::ScalarType dtype, std::uint64_t seed) {
  ::torch::manual_seed(seed);
  ::torch::nn::Conv2d dense(c.options);
  dense->to(dtype);
  dt::Conv2d ours(*dense, DropitOptions().gamma(0));
  CHECK(ours->weight.is_same(dense->weight));
  const at::Tensor x = ::torch::randn(c.input).to(dtype).requires_grad_();
  auto dense_f = float_copy(dense);
  const at::Tensor g = ::torch::randn(dense_f(x.detach().to(at::kFloat)).sizes()).to(dtype);

  const auto mine = run([&] { return ours(x); }, g, {x, ours->weight, ours->bias});
  CHECK(is_dropit_node(mine.output));
  const at::Tensor xf = x.detach().to(at::kFloat).requires_grad_();
  const auto want =
      run([&] { return dense_f(xf); }, g.to(at::kFloat), {xf, dense_f->weight, dense_f->bias});
  const auto bound = magnitude_bound(
      [&](auto x, auto w, auto b) {
        auto o = ::torch::nn::functional::Conv2dFuncOptions()
                     .stride(c.options.stride())
                     .padding(c.options.padding())
                     .dilation(c.options.dilation())
                     .groups(c.options.groups());
        if (b.defined()) o.bias(b);
        return ::torch::nn::functional::conv2d(x, w, o);
      },
      x, dense->weight, dense->bias, g);
  const at::Tensor xs = x.detach().requires_grad_();
  const auto same_type = run([&] { return dense(xs); }, g, {xs, dense->weight, dense->bias});
  // In float32 the forward is torch's own, bit for bit.
  if (dtype == at::kFloat) CHECK(same_values(mine.output, same_type.output));
  check_against(mine, want, same_type, bound);
}

}  // namespace

TEST_CASE("torch: Linear at gamma 0 equals torch::nn::Linear") {
  for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    for (std::size_t i = 0; i < linear_cases.size(); ++i) {
      if (!linear_cases[i].bias) continue;  // see "without bias" below
      const std::string dtype_name = c10::toString(dtype);
      CAPTURE(dtype_name);
      CAPTURE(i);
      check_linear_gamma0(linear_cases[i], dtype, i);
    }
  }
}

TEST_CASE("torch: Conv2d at gamma 0 equals torch::nn::Conv2d") {
  for (std::size_t i = 0; i < conv_cases.size(); ++i) {
    if (!conv_cases[i].options.bias()) continue;  // see "without bias" below
    CAPTURE(i);
    check_conv_gamma0(conv_cases[i], at::kFloat, 100 + i);
  }
}

// LibTorch 1.13 on CPU has no bfloat16 transposed convolution: dX must come from torch's own
// convolution backward, as torch::nn::Conv2d's does.
TEST_CASE("torch: Conv2d at gamma 0 equals torch::nn::Conv2d in bfloat16") {
  for (std::size_t i = 0; i < conv_cases.size(); ++i) {
    if (!conv_cases[i].options.bias()) continue;
    CAPTURE(i);
    check_conv_gamma0(conv_cases[i], at::kBFloat16, 100 + i);
  }
}

namespace {

/// Trains `layer` and torch's `reference` (equal parameters) one step under CPU bfloat16
/// autocast: both outputs are bfloat16, the float32 parameters get float32 gradients, and those
/// agree to bfloat16's precision.
template <class Layer, class Reference>
void check_under_autocast(Layer& layer, Reference& reference, const at::Tensor& x) {
  at::Tensor y, y_ref;
  {
    const cpu_autocast_bfloat16 autocast;
    y = layer->forward(x);
    y_ref = reference->forward(x);
  }
  CHECK((y.scalar_type() == at::kBFloat16));
  CHECK((y_ref.scalar_type() == at::kBFloat16));
  const at::Tensor upstream = ::torch::randn(y.sizes());
  (y.to(at::kFloat) * upstream).sum().backward();
  (y_ref.to(at::kFloat) * upstream).sum().backward();
  CHECK((layer->weight.grad().scalar_type() == at::kFloat));
  const double scale = reference->weight.grad().abs().max().template item<double>();
  CHECK(max_abs_diff(layer->weight.grad(), reference->weight.grad()) <= 2e-2 * scale);
  CHECK(max_abs_diff(layer->bias.grad(), reference->bias.grad()) <= 2e-2 * scale);
}

}  // namespace

// Under autocast the layers cast their inputs first, as torch's own do, so that the cache and dZ
// have the same dtype in backward.
TEST_CASE("torch: Linear and Conv2d train under CPU autocast like torch's layers") {
  ::torch::manual_seed(11);
  dt::Linear linear(::torch::nn::LinearOptions(24, 6), DropitOptions().gamma(0.0));
  ::torch::nn::Linear linear_reference(::torch::nn::LinearOptions(24, 6));
  dt::Conv2d conv(::torch::nn::Conv2dOptions(3, 4, 3).padding(1), DropitOptions().gamma(0.0));
  ::torch::nn::Conv2d conv_reference(::torch::nn::Conv2dOptions(3, 4, 3).padding(1));
  {
    const ::torch::NoGradGuard no_grad;
    linear_reference->weight.copy_(linear->weight);
    linear_reference->bias.copy_(linear->bias);
    conv_reference->weight.copy_(conv->weight);
    conv_reference->bias.copy_(conv->bias);
  }
  check_under_autocast(linear, linear_reference, ::torch::randn({5, 24}));
  check_under_autocast(conv, conv_reference, ::torch::randn({2, 3, 6, 6}));
}

namespace {

struct policy_case {
  const char* name;
  DropitOptions options;
};

const std::vector<policy_case> policy_cases = {
    {"chunked min-k, D = 64", DropitOptions().gamma(0.7).chunk_size(64)},
    {"chunked min-k, default D", DropitOptions().gamma(0.9)},
    {"min-k", DropitOptions().selection(selection_kind::min_k).gamma(0.5)},
    {"random, D = 100",
     DropitOptions().selection(selection_kind::random).gamma(0.6).chunk_size(100).seed(42)},
    {"random, rescaled",
     DropitOptions().selection(selection_kind::random).gamma(0.5).chunk_size(128).rescale(true)},
    {"channel min-k", DropitOptions()
                          .selection(selection_kind::min_k)
                          .granularity(granularity_kind::channel)
                          .gamma(0.5)},
    {"channel random", DropitOptions()
                           .selection(selection_kind::random)
                           .granularity(granularity_kind::channel)
                           .gamma(0.4)
                           .seed(3)},
};

/// A copy of `dense` with |W| and |b|: run on |x| and |dZ| it gives Σ|terms| of each result.
template <class Dense>
Dense abs_copy(const Dense& dense) {
  Dense copy = float_copy(dense);
  ::torch::NoGradGuard no_grad;
  for (auto& p : copy->parameters()) p.abs_();
  return copy;
}

/// Runs `ours` twice (forward calls 0 and 1, whose random draws differ) and checks each against
/// torch on the densified cache of the same input under the spec the layer used for that call.
template <class Ours, class Dense>
void check_sparse_layer(Ours& ours, Dense& dense, const DropitOptions& options, int axis,
                        const at::Tensor& x, const at::Tensor& g) {
  Dense abs_dense = abs_copy(dense);
  for (std::uint64_t call = 0; call < 2; ++call) {
    CAPTURE(call);
    const auto mine = run([&] { return ours(x); }, g, {x, ours->weight, ours->bias});
    REQUIRE(is_dropit_node(mine.output));

    const dt::saved_cache cache = dt::compress(x.detach(), options.spec(axis, call));
    const at::Tensor xd = dt::densify(cache);
    // Something was dropped, and the kept values are nonzero (randn input) where kept.
    CHECK(cache.layout.kept() < x.numel());
    CHECK((xd != 0).sum().template item<std::int64_t>() == cache.layout.kept());

    // dW: torch's dense autograd with the densified input. dX, db, output: torch on the input.
    const auto on_cache = run([&] { return dense(xd); }, g, {dense->weight});
    const auto on_input = run([&] { return dense(x); }, g, {x, dense->weight, dense->bias});
    const at::Tensor xa = x.detach().abs().requires_grad_();
    const auto cache_bound = run([&] { return abs_dense(xd.abs()); }, g.abs(), {abs_dense->weight});
    const auto input_bound =
        run([&] { return abs_dense(xa); }, g.abs(), {xa, abs_dense->weight, abs_dense->bias});

    CHECK(same_values(mine.output, on_input.output));
    check_close(mine.grads[1], on_cache.grads[0], cache_bound.grads[0], float_rel,
                "weight gradient vs densified cache");
    // The weight gradient really came from the cache, not from the dense input.
    CHECK(max_abs_diff(mine.grads[1], on_input.grads[1]) > 1e-3);
    check_close(mine.grads[0], on_input.grads[0], input_bound.grads[0], float_rel,
                "input gradient (full weight)");
    CHECK(mine.grads[2].defined() == on_input.grads[2].defined());
    if (mine.grads[2].defined())
      check_close(mine.grads[2], on_input.grads[2], input_bound.grads[2], float_rel,
                  "bias gradient");
  }
  // Random selection draws afresh on every forward call (element granularity: many elements, so
  // two draws coinciding is out of the question).
  if (options.selection() == selection_kind::random &&
      options.granularity() == granularity_kind::element) {
    CHECK(!same_values(dt::densify(dt::compress(x.detach(), options.spec(axis, 0))),
                       dt::densify(dt::compress(x.detach(), options.spec(axis, 1)))));
  }
}

void check_sparse_linear(const policy_case& p, const std::vector<std::int64_t>& shape, bool bias,
                         std::uint64_t seed) {
  ::torch::manual_seed(seed);
  ::torch::nn::Linear dense(::torch::nn::LinearOptions(shape.back(), 16).bias(bias));
  dt::Linear ours(*dense, p.options);
  const at::Tensor x = ::torch::randn(shape).requires_grad_();
  const at::Tensor g = ::torch::randn(linear_output_shape(shape, 16));
  check_sparse_layer(ours, dense, p.options, -1, x, g);
}

void check_sparse_conv(const policy_case& p, const conv_case& c, std::uint64_t seed) {
  ::torch::manual_seed(seed);
  ::torch::nn::Conv2d dense(c.options);
  dt::Conv2d ours(*dense, p.options);
  const at::Tensor x = ::torch::randn(c.input).requires_grad_();
  const at::Tensor g = ::torch::randn(dense(x.detach()).sizes());
  check_sparse_layer(ours, dense, p.options, 1, x, g);
}

const std::vector<conv_case> sparse_conv_cases = {
    {{2, 6, 9, 11}, ::torch::nn::Conv2dOptions(6, 8, 3).stride(2).padding(1).groups(2)},
    {{3, 4, 8, 8}, ::torch::nn::Conv2dOptions(4, 5, {2, 3}).dilation({2, 1})},
};

}  // namespace

TEST_CASE("torch: Linear at gamma > 0: dW from the densified cache, dX from the full weight") {
  for (const auto& p : policy_cases) {
    const std::string policy = p.name;
    CAPTURE(policy);
    check_sparse_linear(p, {40, 37}, true, 11);
    check_sparse_linear(p, {3, 50, 24}, true, 12);
  }
}

TEST_CASE("torch: Conv2d at gamma > 0: dW from the densified cache, dX from the full weight") {
  for (const auto& p : policy_cases) {
    const std::string policy = p.name;
    CAPTURE(policy);
    for (std::size_t i = 0; i < sparse_conv_cases.size(); ++i) {
      CAPTURE(i);
      check_sparse_conv(p, sparse_conv_cases[i], 20 + i);
    }
  }
}

// The layers pass dZ on with the strides it comes with (the gradient of a sum is an expanded
// scalar, a channels-last model's is channels-last): both weight-gradient paths must read it as
// torch reads it, against the dense formula dW = dZᵀ · densify(cache) on the same cache.
TEST_CASE("torch: weight gradients take dZ of any strides") {
  dropit::policy_spec spec;
  spec.gamma = 0.5;
  spec.chunk_size = 16;
  const dt::saved_cache rows = dt::compress(::torch::randn({6, 4}), spec);
  const dt::saved_cache image = dt::compress(::torch::randn({2, 4, 5, 5}), spec);
  const std::vector<at::Tensor> linear_dz{::torch::randn({3, 6}).t(),
                                          ::torch::full({}, 0.5).expand({6, 3})};
  const std::vector<at::Tensor> conv_dz{
      ::torch::randn({2, 6, 3, 3}).contiguous(at::MemoryFormat::ChannelsLast),
      ::torch::full({}, 0.5).expand({2, 6, 3, 3})};
  const at::Tensor dense_rows = dt::densify(rows), dense_image = dt::densify(image);
  for (const auto path : {dt::weight_grad_path::sparse, dt::weight_grad_path::densify}) {
    const std::string path_name(dt::name_of(path));
    CAPTURE(path_name);
    for (const at::Tensor& dz : linear_dz) {
      REQUIRE_FALSE(dz.is_contiguous());
      const at::Tensor want = dz.t().matmul(dense_rows);
      CHECK(at::allclose(dt::linear_weight_grad(rows, dz, path), want, 1e-5, 1e-6));
    }
    for (const at::Tensor& dz : conv_dz) {
      REQUIRE_FALSE(dz.is_contiguous());
      const at::Tensor weight = ::torch::zeros({6, 4, 3, 3});
      const at::Tensor want = std::get<1>(
          at::convolution_backward(dz.contiguous(), dense_image, weight, c10::nullopt, {1, 1},
                                   {0, 0}, {1, 1}, false, {0, 0}, 1, {false, true, false}));
      CHECK(at::allclose(dt::conv2d_weight_grad(image, dz, {6, 4, 3, 3}, {}, path), want, 1e-5,
                         1e-6));
    }
  }
}

// LibTorch 1.13's autograd::Function::apply rejects undefined tensor arguments (such as the bias of
// a bias-free layer): the adapters must pass the absent bias some other way.
TEST_CASE("torch: Linear and Conv2d without bias train like torch's") {
  for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    const std::string dtype_name = c10::toString(dtype);
    CAPTURE(dtype_name);
    for (std::size_t i = 0; i < linear_cases.size(); ++i) {
      CAPTURE(i);
      if (!linear_cases[i].bias) check_linear_gamma0(linear_cases[i], dtype, i);
    }
    for (std::size_t i = 0; i < conv_cases.size(); ++i) {
      CAPTURE(i);
      if (!conv_cases[i].options.bias()) check_conv_gamma0(conv_cases[i], dtype, 100 + i);
    }
  }
  for (const auto& p : policy_cases) {
    const std::string policy = p.name;
    CAPTURE(policy);
    check_sparse_linear(p, {40, 37}, false, 13);
    check_sparse_conv(p, {{3, 4, 8, 8}, ::torch::nn::Conv2dOptions(4, 5, 3).bias(false)}, 23);
  }
}

TEST_CASE("torch: ReLU equals torch::relu, NaN and zeros included") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    const std::string dtype_name = c10::toString(dtype);
    CAPTURE(dtype_name);
    ::torch::manual_seed(5);
    // 1000 elements: 31 full mask words and a partial one.
    at::Tensor base = ::torch::randn({10, 100});
    base.view({-1}).slice(0, 0, 8).copy_(
        ::torch::tensor({0.0f, -0.0f, nan, -nan, inf, -inf, 1e-30f, -1e-30f}));
    base.view({-1}).slice(0, 500, 600).zero_();
    base = base.to(dtype);
    const at::Tensor g = ::torch::randn({10, 100}).to(dtype);

    const at::Tensor x = base.clone().requires_grad_();
    dt::ReLU relu;
    const auto mine = run([&] { return relu(x); }, g, {x});
    CHECK(is_dropit_node(mine.output));
    const at::Tensor xr = base.clone().requires_grad_();
    const auto want = run([&] { return ::torch::relu(xr); }, g, {xr});
    CHECK(same_values(mine.output, want.output));
    CHECK(same_values(mine.grads[0], want.grads[0]));
    // Where the output is NaN the gradient passes, as in PyTorch's threshold_backward.
    CHECK(mine.grads[0].view({-1})[2].template item<float>() ==
          g.view({-1})[2].template item<float>());
    CHECK(mine.grads[0].view({-1})[0].template item<float>() == 0.0f);

    // Without a gradient to track it is torch's relu.
    const at::Tensor plain = relu(base);
    CHECK(!plain.grad_fn());
    CHECK(same_values(plain, want.output));
  }
}

// A channels-last model's ReLU stays channels-last, and its mask is the same tensor's stored
// contiguously, so a gradient in either layout (the compiler picks one) is masked right.
TEST_CASE("torch: channels-last ReLU keeps its layout; its mask reads a gradient in any layout") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  ::torch::manual_seed(11);
  // Planes of 35 pixels start mid-word; 70 channels cut the kernels' channel tiles short.
  at::Tensor base = ::torch::randn({3, 70, 7, 5});
  base.view({-1}).slice(0, 0, 4).copy_(::torch::tensor({0.0f, -0.0f, nan, 1e-30f}));
  for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    const std::string dtype_name = c10::toString(dtype);
    CAPTURE(dtype_name);
    const at::Tensor x = base.to(dtype).contiguous(at::MemoryFormat::ChannelsLast);
    const auto [output, mask] = dt::relu_with_mask(x);
    CHECK(output.is_contiguous(at::MemoryFormat::ChannelsLast));
    CHECK(same_values(output, ::torch::relu(x)));
    CHECK(at::equal(mask, std::get<1>(dt::relu_with_mask(x.contiguous()))));
    const at::Tensor g = ::torch::randn(x.sizes()).to(dtype);
    const at::Tensor want = ::torch::threshold_backward(g, ::torch::relu(x), 0);
    for (const at::Tensor& dy : {g.contiguous(), g.contiguous(at::MemoryFormat::ChannelsLast),
                                 g.transpose(2, 3).contiguous().transpose(2, 3)}) {
      const at::Tensor dx = dt::relu_backward(dy, mask);
      CHECK(same_values(dx, want));
      if (dy.is_contiguous() || dy.is_contiguous(at::MemoryFormat::ChannelsLast))
        CHECK(dx.strides() == dy.strides());
    }
    // Through the layer: output, layout and gradient as torch's.
    const at::Tensor xg = x.clone().requires_grad_();
    dt::ReLU relu;
    const auto mine = run([&] { return relu(xg); }, g, {xg});
    CHECK(mine.output.is_contiguous(at::MemoryFormat::ChannelsLast));
    CHECK(same_values(mine.grads[0], want));
  }
}

// A channels-last activation is compressed where it lies, in its logical order: its cache is the
// contiguous copy's, so a convolution of a channels-last model learns what a contiguous one does.
TEST_CASE("torch: a channels-last input is compressed in place, as its contiguous copy") {
  ::torch::manual_seed(12);
  // Planes of 35 pixels, cut mid-plane by chunks of 64; 70 channels.
  const at::Tensor base = ::torch::randn({3, 70, 7, 5});
  for (const at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    const std::string dtype_name = c10::toString(dtype);
    CAPTURE(dtype_name);
    const at::Tensor x = base.to(dtype).contiguous(at::MemoryFormat::ChannelsLast);
    REQUIRE_FALSE(x.is_contiguous());
    for (const auto& p : policy_cases) {
      const std::string policy = p.name;
      CAPTURE(policy);
      const dt::saved_cache mine = dt::compress(x, p.options.spec(1, 0));
      const dt::saved_cache want = dt::compress(x.contiguous(), p.options.spec(1, 0));
      CHECK(at::equal(mine.values, want.values));
      CHECK(at::equal(mine.positions, want.positions));
    }
  }
  // Through the layer: the output keeps the layout, dW is torch's on the contiguous copy's cache.
  ::torch::nn::Conv2d dense(::torch::nn::Conv2dOptions(70, 8, 3).padding(1));
  const DropitOptions options = DropitOptions().gamma(0.7).chunk_size(64);
  dt::Conv2d ours(*dense, options);
  const at::Tensor x = base.contiguous(at::MemoryFormat::ChannelsLast).requires_grad_();
  const at::Tensor g = ::torch::randn({3, 8, 7, 5});
  const auto mine = run([&] { return ours(x); }, g, {x, ours->weight});
  CHECK(mine.output.is_contiguous(at::MemoryFormat::ChannelsLast));
  const at::Tensor on_cache = dt::densify(dt::compress(base, options.spec(1, 0)));
  const auto want = run([&] { return dense(on_cache); }, g, {dense->weight});
  CHECK(at::allclose(mine.grads[1], want.grads[0], 1e-4, 1e-5));
  CHECK(at::allclose(mine.grads[0], run([&] { return dense(x); }, g, {x}).grads[0], 1e-4, 1e-5));
}

TEST_CASE("torch: ReLU keeps a 1-bit mask, not its output") {
  dt::MemoryMeter meter;
  const std::int64_t n = 1000 * 1000 + 7;
  const at::Tensor x = ::torch::randn({n}).requires_grad_();
  const at::Tensor h = x * 1.5;  // a graph that outlives the ReLU's output
  const std::int64_t output_bytes = n * 4;
  const std::int64_t mask_bytes = dropit::relu_mask_words(n) * 4;

  SUBCASE("dropit ReLU: deleting the output frees it; the graph holds the mask") {
    const std::int64_t before = meter.current();
    at::Tensor y = dt::ReLU()(h);
    at::Tensor loss = y.sum();  // sum saves no tensor
    const std::int64_t with_output = meter.current();
    y.reset();
    const std::int64_t after = meter.current();
    MESSAGE("dropit ReLU of ", n, " floats: graph holds ", after - before, " B");
    CHECK(with_output - after == output_bytes);
    CHECK(after - before == mask_bytes + static_cast<std::int64_t>(loss.nbytes()));
    loss.backward();
    CHECK(same_values(x.grad(), (h.detach() > 0).to(at::kFloat) * 1.5));
  }
  SUBCASE("torch's relu keeps its output alive (the contrast)") {
    const std::int64_t before = meter.current();
    at::Tensor y = ::torch::relu(h);
    at::Tensor loss = y.sum();
    const std::int64_t with_output = meter.current();
    y.reset();
    const std::int64_t after = meter.current();
    MESSAGE("torch relu of ", n, " floats: graph holds ", after - before, " B");
    CHECK(with_output == after);
    CHECK(after - before == output_bytes + static_cast<std::int64_t>(loss.nbytes()));
  }
}

TEST_CASE("torch: eval mode and no-grad run the dense forward and cache nothing") {
  dt::MemoryMeter meter;
  ::torch::manual_seed(3);
  ::torch::nn::Linear dense_linear(64, 32);
  ::torch::nn::Conv2d dense_conv(::torch::nn::Conv2dOptions(4, 8, 3).padding(1));
  dt::Linear linear(*dense_linear, DropitOptions().gamma(0.9));
  dt::Conv2d conv(*dense_conv, DropitOptions().gamma(0.9));
  dt::ReLU relu;
  const at::Tensor xl = ::torch::randn({128, 64}).requires_grad_();
  const at::Tensor xc = ::torch::randn({4, 4, 16, 16}).requires_grad_();

  SUBCASE("training with gradients: dropit's nodes (the positive control)") {
    CHECK(is_dropit_node(linear(xl)));
    CHECK(is_dropit_node(conv(xc)));
    CHECK(is_dropit_node(relu(xl)));
  }
  SUBCASE("no-grad: no node, and the output is all that is allocated") {
    ::torch::NoGradGuard no_grad;
    for (int layer = 0; layer < 3; ++layer) {
      CAPTURE(layer);
      const std::int64_t before = meter.current();
      at::Tensor y = layer == 0 ? linear(xl) : layer == 1 ? conv(xc) : relu(xl);
      CHECK(!y.grad_fn());
      CHECK(meter.current() - before == static_cast<std::int64_t>(y.nbytes()));
      const at::Tensor want = layer == 0   ? dense_linear(xl)
                              : layer == 1 ? dense_conv(xc)
                                           : ::torch::relu(xl);
      CHECK(same_values(y, want));
    }
  }
  SUBCASE("eval mode with gradients: torch's own nodes, same values") {
    linear->eval();
    conv->eval();
    for (int layer = 0; layer < 2; ++layer) {
      CAPTURE(layer);
      at::Tensor y = layer == 0 ? linear(xl) : conv(xc);
      REQUIRE(y.grad_fn());
      CAPTURE(grad_fn_name(y));
      CHECK(!is_dropit_node(y));
      const at::Tensor want = layer == 0 ? dense_linear(xl) : dense_conv(xc);
      CHECK(grad_fn_name(y) == grad_fn_name(want));
      CHECK(same_values(y, want));
    }
  }
  SUBCASE("a frozen weight needs no cache: dense path, input gradient still right") {
    linear->weight.requires_grad_(false);
    const at::Tensor g = ::torch::randn({128, 32});
    const auto mine = run([&] { return linear(xl); }, g, {xl, linear->bias});
    CHECK(!is_dropit_node(mine.output));
    check_close(mine.grads[0], g.mm(linear->weight.detach()),
                g.abs().mm(linear->weight.detach().abs()), float_rel, "input gradient");
    check_close(mine.grads[1], g.sum(0), g.abs().sum(0), float_rel, "bias gradient");
  }
  SUBCASE("an input that needs no gradient: dropit caches for dW, returns no dX") {
    const at::Tensor x = xl.detach();
    const at::Tensor g = ::torch::randn({128, 32});
    const auto mine = run([&] { return linear(x); }, g, {x, linear->weight, linear->bias});
    CHECK(is_dropit_node(mine.output));
    CHECK(!mine.grads[0].defined());
    const at::Tensor xd = dt::densify(dt::compress(x, linear->dropit.spec(-1, 0)));
    check_close(mine.grads[1], g.t().mm(xd), g.abs().t().mm(xd.abs()), float_rel,
                "weight gradient");
  }
}

TEST_CASE("torch: dropit's nodes repeat their gradients on a retained graph, refuse a freed one") {
  ::torch::manual_seed(5);
  ::torch::nn::Linear dense_linear(16, 8);
  ::torch::nn::Conv2d dense_conv(::torch::nn::Conv2dOptions(3, 4, 3).padding(1));
  dt::Linear linear(*dense_linear, DropitOptions().gamma(0.5));
  dt::Conv2d conv(*dense_conv, DropitOptions().gamma(0.5));
  dt::ReLU relu;
  const at::Tensor xl = ::torch::randn({6, 16}).requires_grad_();
  const at::Tensor xc = ::torch::randn({2, 3, 8, 8}).requires_grad_();
  for (int layer = 0; layer < 3; ++layer) {
    CAPTURE(layer);
    const at::Tensor y = layer == 0 ? linear(xl) : layer == 1 ? conv(xc) : relu(xl);
    REQUIRE(is_dropit_node(y));
    std::vector<at::Tensor> inputs{layer == 1 ? xc : xl};
    if (layer == 0) inputs.insert(inputs.end(), {linear->weight, linear->bias});
    if (layer == 1) inputs.insert(inputs.end(), {conv->weight, conv->bias});
    const at::Tensor upstream = ::torch::randn_like(y);
    const auto first = ::torch::autograd::grad({y}, inputs, {upstream}, /*retain_graph=*/true);
    const auto again = ::torch::autograd::grad({y}, inputs, {upstream});
    REQUIRE(first.size() == inputs.size());
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      CAPTURE(i);
      CHECK(same_values(first[i], again[i]));
    }
    // The graph is freed: the saved tensors are gone, and torch says so in its own words.
    const std::string message =
        error_message([&] { ::torch::autograd::grad({y}, inputs, {upstream}); });
    CAPTURE(message);
    CHECK(message.find("second time") != std::string::npos);
  }
}
