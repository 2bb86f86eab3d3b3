// A dropit Linear or Conv2d reading the untouched output of a dropit producer (LayerNorm,
// BatchNorm2d, GELU, SiLU, optionally through a dropit ReLU) caches nothing and recomputes that
// output in backward from the tensors the producer's own backward keeps: its weight gradient is
// torch's, bit for bit (after a BatchNorm in training, which the layer recomputes from the batch's
// statistics in one pass: within rounding), whatever gamma is, and after forward only the
// producers' inputs stay held.
// Where the mark no longer holds (the output changed in place, autocast, recompute off) the layer
// caches as before.

#include <atomic>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include <ATen/record_function.h>

#include "torch_helpers.hpp"

namespace {

using namespace torch_test;
using dt::ConvertOptions;
using dt::DropitOptions;
namespace nn = ::torch::nn;

constexpr std::int64_t rows = 256, width = 256;

/// linear -> LayerNorm -> linear -> GELU -> linear, the same parameters for the same seed.
nn::Sequential make_stack(std::uint64_t seed = 0) {
  ::torch::manual_seed(seed);
  return nn::Sequential(nn::Linear(64, width), nn::LayerNorm(nn::LayerNormOptions({width})),
                        nn::Linear(width, 2 * width), nn::GELU(), nn::Linear(2 * width, 64));
}

/// Bytes the graph holds after forward (the output excluded), on the step after a first one.
std::int64_t held_after_forward(nn::Sequential& model, const at::Tensor& x) {
  std::int64_t held = 0;
  for (int step = 0; step < 2; ++step) {
    model->zero_grad(/*set_to_none=*/true);
    dt::MemoryMeter meter;
    const std::int64_t base = meter.current();
    at::Tensor y = model->forward(x);
    held = meter.current() - base - static_cast<std::int64_t>(y.nbytes());
    y.square().sum().backward();
  }
  return held;
}

/// The operator `calls_while` counts, and its count (a RecordFunction callback takes no captures).
std::atomic<const char*> counted_operator{nullptr};
std::atomic<int> operator_calls{0};

/// How many times `f` calls the ATen operator `name` ("aten::linear").
template <class F>
int calls_while(const char* name, F&& f) {
  counted_operator = name;
  operator_calls = 0;
  const auto counting = at::addGlobalCallback(at::RecordFunctionCallback(
      [](const at::RecordFunction& function) -> std::unique_ptr<at::ObserverContext> {
        if (std::string_view(function.name()) == counted_operator.load()) ++operator_calls;
        return nullptr;
      }));
  f();
  at::removeCallback(counting);
  return operator_calls;
}

/// The gradients of sum(y²) with respect to the input and every parameter.
std::vector<at::Tensor> model_gradients(nn::Sequential& model, const at::Tensor& x) {
  return gradients(*model, x, [&](const at::Tensor& input) { return model->forward(input); });
}

}  // namespace

TEST_CASE("torch: Linear layers after a LayerNorm and a GELU recompute their inputs, bit for bit") {
  nn::Sequential dense = make_stack();
  nn::Sequential model = make_stack();
  const dt::ConvertReport report =
      dt::convert(model, ConvertOptions().dropit(DropitOptions().gamma(0.9)));
  CHECK(report.converted == std::vector<std::string>{"2", "4"});  // "0" keeps the data as it is
  CHECK(report.producers == std::vector<std::string>{"1", "3"});
  std::ostringstream printed;
  printed << report;
  CHECK(printed.str().find("~ 1: producer") != std::string::npos);

  const at::Tensor x = ::torch::randn({rows, 64});
  const std::int64_t dense_held = held_after_forward(dense, x);
  const std::int64_t held = held_after_forward(model, x);
  // Held: the LayerNorm's input and its two per-row statistics, the GELU's input. Dense also holds
  // both of their outputs.
  const std::int64_t producer_inputs = 4 * rows * (width + 2 * width);
  MESSAGE("held after forward: dense ", dense_held, " B, recomputing ", held, " B");
  CHECK(held >= producer_inputs);
  CHECK(held <= producer_inputs + 4 * 2 * rows + 4096);
  CHECK(static_cast<double>(held) / static_cast<double>(dense_held) <= 0.56);

  // The same kernels on the same tensors: bit for bit.
  check_equal(model_gradients(model, x), model_gradients(dense, x));
}

TEST_CASE("torch: cache(false) recomputes what it can and keeps the rest as torch does: exact") {
  // linear -> LayerNorm -> linear -> GELU -> linear -> Tanh -> linear: the last layer's input
  // comes from no producer dropit knows, so it would take a DropIT cache.
  const auto make = [] {
    nn::Sequential stack = make_stack();
    stack->push_back(nn::Tanh());
    stack->push_back(nn::Linear(64, 32));
    return stack;
  };
  nn::Sequential dense = make();
  nn::Sequential exact = make();
  nn::Sequential caching = make();
  dt::convert(exact, ConvertOptions().dropit(DropitOptions().gamma(0.9).cache(false)));
  dt::convert(caching, ConvertOptions().dropit(DropitOptions().gamma(0.9)));
  std::ostringstream printed;
  printed << *exact;
  CHECK(printed.str().find("cache=false") != std::string::npos);

  const at::Tensor x = ::torch::randn({rows, 64});
  at::Tensor y = exact->forward(x);
  CHECK(grad_fn_name(y).find("Addmm") != std::string::npos);  // torch's own linear, input kept
  CHECK(grad_fn_name(caching->forward(x)).find("Addmm") == std::string::npos);

  // Held: dense's bytes less the two outputs the producers give again; the Tanh's output, which
  // the last layer keeps whole here (Tanh's backward keeps it too: one tensor), stays.
  const std::int64_t dense_held = held_after_forward(dense, x);
  const std::int64_t held = held_after_forward(exact, x);
  const std::int64_t recomputed_outputs = 4 * rows * (width + 2 * width);
  MESSAGE("held after forward: dense ", dense_held, " B, cache(false) ", held, " B");
  CHECK(held >= dense_held - recomputed_outputs);
  CHECK(held <= dense_held - recomputed_outputs + 4096);

  // Recomputation runs the same kernels on the same tensors, the rest is torch's: bit for bit.
  check_equal(model_gradients(exact, x), model_gradients(dense, x));
}

TEST_CASE("torch: recompute_layers: a GELU after a recomputing Linear keeps none of it") {
  nn::Sequential dense = make_stack(), model = make_stack();
  dt::convert(model, ConvertOptions().dropit(DropitOptions().gamma(0.9).recompute_layers(true)));
  const at::Tensor x = ::torch::randn({rows, 64});
  const std::int64_t dense_held = held_after_forward(dense, x);
  const std::int64_t held = held_after_forward(model, x);
  // Held: the LayerNorm's per-row statistics only. The first Linear keeps its input, the data, as
  // it is (skip_first), so the LayerNorm recomputes its own input through it; the last Linear
  // recomputes the GELU's output through the middle Linear, and the GELU its input the same way.
  const std::int64_t statistics = 4 * 2 * rows, norm_input = 4 * rows * width;
  MESSAGE("held after forward: dense ", dense_held, " B, recomputing through layers ", held, " B");
  CHECK(held >= statistics);
  CHECK(held <= statistics + 4096);
  // The same kernels on the same tensors: bit for bit.
  check_equal(model_gradients(model, x), model_gradients(dense, x));

  SUBCASE("backward runs each of the first two Linears' forwards once") {
    // The last Linear recomputes the GELU's output through both; the GELU, the middle Linear and
    // the LayerNorm take the inputs that were left on the way instead of running a Linear again.
    at::Tensor y = model->forward(x);
    CHECK(calls_while("aten::linear", [&] { y.square().sum().backward(); }) == 2);
  }
  SUBCASE("a first Linear caching its input: the LayerNorm keeps its own") {
    // Its output is no layer's forward on a kept input, so it is not offered; the chain of the
    // middle Linear starts at the LayerNorm.
    nn::Sequential caching_first = make_stack();
    dt::convert(caching_first, ConvertOptions().skip_first(false).dropit(
                                   DropitOptions().gamma(0.9).recompute_layers(true)));
    const std::int64_t first_input = 4 * rows * 64;
    const std::int64_t caching_held = held_after_forward(caching_first, x);
    CHECK(caching_held >= norm_input);
    CHECK(caching_held <= norm_input + statistics + first_input / 2);
  }
  SUBCASE("off, the GELU keeps its input") {
    nn::Sequential default_model = make_stack();
    dt::convert(default_model, ConvertOptions().dropit(DropitOptions().gamma(0.9)));
    CHECK(held_after_forward(default_model, x) >= norm_input + 4 * rows * 2 * width);
  }
}

TEST_CASE("torch: recompute_layers chains two layers at most, bit for bit") {
  // LayerNorm -> Linear -> LayerNorm -> Linear -> LayerNorm -> Linear -> SiLU -> Linear. The
  // second LayerNorm keeps nothing: its input is the first Linear's forward again; the third keeps
  // nothing either: its input is the second Linear's forward on that. The third Linear's input
  // runs two layers already, so its output is not offered: the SiLU keeps its input, and a chain
  // computes no more than a block's worth ahead in backward.
  const auto make = [] {
    ::torch::manual_seed(4);
    return nn::Sequential(nn::LayerNorm(nn::LayerNormOptions({32})), nn::Linear(32, 48),
                          nn::LayerNorm(nn::LayerNormOptions({48})), nn::Linear(48, 48),
                          nn::LayerNorm(nn::LayerNormOptions({48})), nn::Linear(48, 48), nn::SiLU(),
                          nn::Linear(48, 16));
  };
  nn::Sequential dense = make(), model = make();
  dt::convert(model, ConvertOptions().skip_first(false).dropit(
                         DropitOptions().gamma(0.9).recompute_layers(true)));
  const at::Tensor x = ::torch::randn({4, 8, 32});
  CHECK(grad_fn_name(model->forward(x)).find("RecomputingLinear") != std::string::npos);
  // The first LayerNorm's input (the data, held by the caller), the SiLU's, three LayerNorms'
  // per-row statistics.
  const std::int64_t silu_input = 4 * 4 * 8 * 48, statistics = 4 * 4 * 8 * (2 + 2 + 2);
  const std::int64_t held = held_after_forward(model, x);
  CHECK(held >= silu_input);
  CHECK(held <= silu_input + statistics + 4096);
  check_equal(model_gradients(model, x), model_gradients(dense, x));
}

TEST_CASE("torch: recomputation after SiLU and an affine-free LayerNorm, 3-d inputs, no bias") {
  const auto make = [] {
    ::torch::manual_seed(3);
    return nn::Sequential(nn::LayerNorm(nn::LayerNormOptions({32}).elementwise_affine(false)),
                          nn::Linear(nn::LinearOptions(32, 48).bias(false)), nn::SiLU(),
                          nn::Linear(48, 16));
  };
  nn::Sequential dense = make(), model = make();
  const dt::ConvertReport report =
      dt::convert(model, ConvertOptions().skip_first(false).dropit(DropitOptions().gamma(0.95)));
  CHECK(report.converted == std::vector<std::string>{"1", "3"});
  CHECK(report.producers == std::vector<std::string>{"0", "2"});
  const at::Tensor x = ::torch::randn({4, 8, 32});
  CHECK(grad_fn_name(model->forward(x)).find("RecomputingLinear") != std::string::npos);
  check_equal(model_gradients(model, x), model_gradients(dense, x));
  // Eval mode and no-grad run the plain forward.
  model->eval();
  dense->eval();
  CHECK(same_values(model->forward(x), dense->forward(x)));
}

TEST_CASE("torch: a Linear caches when its input is no longer the producer's untouched output") {
  ::torch::manual_seed(5);
  nn::Linear dense(32, 16);
  dt::Linear recomputing(*dense, DropitOptions().gamma(0.9));
  dt::Linear caching(*dense, DropitOptions().gamma(0.9).recompute(false));
  dt::LayerNorm norm(nn::LayerNormOptions({32}));
  const at::Tensor x = ::torch::randn({16, 32});
  const auto recomputed = [](const at::Tensor& y) {
    return grad_fn_name(y).find("RecomputingLinear") != std::string::npos;
  };
  CHECK(recomputed(recomputing->forward(norm->forward(x))));
  CHECK_FALSE(recomputed(caching->forward(norm->forward(x))));  // recompute off

  SUBCASE("changed in place: the cache of the changed values, as without recomputation") {
    at::Tensor h = norm->forward(x);
    h.mul_(2.0);
    const at::Tensor y = recomputing->forward(h);
    CHECK_FALSE(recomputed(y));
    const at::Tensor want_input = (norm->forward(x) * 2.0).detach();
    const at::Tensor upstream = ::torch::randn({16, 16});
    const auto got = ::torch::autograd::grad({(y * upstream).sum()}, {dense->weight});
    const auto want =
        ::torch::autograd::grad({(caching->forward(want_input) * upstream).sum()}, {dense->weight});
    CHECK(same_values(got[0], want[0]));
  }
  SUBCASE("a view of the output") {
    CHECK_FALSE(recomputed(recomputing->forward(norm->forward(x).view({8, 2, 32}))));
  }
  SUBCASE("a source changed in place after the producer ran") {
    at::Tensor source = x.clone();
    const at::Tensor h = norm->forward(source);
    source.add_(1.0);
    CHECK_FALSE(recomputed(recomputing->forward(h)));
  }
  SUBCASE("produced under no-grad") {
    at::Tensor h;
    {
      const ::torch::NoGradGuard no_grad;
      h = norm->forward(x);
    }
    CHECK_FALSE(recomputed(recomputing->forward(h)));
  }
  SUBCASE("under autocast the layer computes in another dtype than the producer's output") {
    const cpu_autocast_bfloat16 autocast;
    CHECK_FALSE(recomputed(recomputing->forward(norm->forward(x))));
  }
}

namespace {

/// conv -> BatchNorm -> ReLU -> conv -> BatchNorm -> ReLU -> 1x1 conv, as in a ResNet's body.
nn::Sequential make_conv_stack(std::uint64_t seed) {
  ::torch::manual_seed(seed);
  const auto conv = [](std::int64_t in, std::int64_t out, std::int64_t kernel) {
    return nn::Conv2d(nn::Conv2dOptions(in, out, kernel).padding(kernel / 2).bias(false));
  };
  nn::Sequential stack(conv(3, 16, 3), nn::BatchNorm2d(16), nn::ReLU(), conv(16, 16, 3),
                       nn::BatchNorm2d(16), nn::ReLU(), nn::Conv2d(16, 8, 1));
  // BatchNorm's scale and shift away from 1 and 0, so that the recomputation must apply them.
  const ::torch::NoGradGuard no_grad;
  for (const std::size_t i : {1, 4}) {
    auto* norm = stack[i]->as<nn::BatchNorm2d>();
    norm->weight.uniform_(0.5, 1.5);
    norm->bias.normal_(0.0, 0.5);
  }
  return stack;
}

/// The conv stack converted with `dropit` (and the 1-bit ReLU) beside its dense twin, both having
/// run the same forwards (so that their running statistics stay comparable), and the bytes each
/// holds after forward.
struct converted_conv_stack {
  explicit converted_conv_stack(const DropitOptions& dropit)
      : report(dt::convert(model, ConvertOptions().relu(true).dropit(dropit))) {
    // The last convolution reads a recomputed input.
    CHECK(grad_fn_name(model->forward(x)).find("RecomputingConv2d") != std::string::npos);
    dense->forward(x);
    dense_held = held_after_forward(dense, x);
    held = held_after_forward(model, x);
    MESSAGE("held after forward: dense ", dense_held, " B, converted ", held, " B");
  }

  nn::Sequential dense = make_conv_stack(11), model = make_conv_stack(11);
  dt::ConvertReport report;
  at::Tensor x = ::torch::randn({8, 3, 24, 24});
  std::int64_t dense_held = 0, held = 0;
};

/// Bytes of one of the stack's 16-channel activations.
constexpr std::int64_t conv_activation = 4 * 8 * 16 * 24 * 24;

}  // namespace

TEST_CASE("torch: Conv2d layers after BatchNorm2d -> ReLU recompute their inputs") {
  converted_conv_stack stack(DropitOptions().gamma(0.9));
  nn::Sequential &dense = stack.dense, &model = stack.model;
  const at::Tensor& x = stack.x;
  CHECK(stack.report.converted == std::vector<std::string>{"2", "3", "5", "6"});  // "0": the data
  CHECK(stack.report.producers == std::vector<std::string>{"1", "4"});

  // Held: both BatchNorms' inputs (and their per-channel statistics) and the ReLUs' 1-bit masks.
  // Dense also holds both ReLU outputs, which the next convolutions save.
  const std::int64_t held = stack.held, dense_held = stack.dense_held;
  const std::int64_t activation = conv_activation;
  CHECK(held >= 2 * activation + 2 * activation / 32);
  CHECK(held <= 2 * activation + 2 * activation / 32 + 4096);
  CHECK(dense_held >= 4 * activation);

  // Gradients: [x, conv 0, BatchNorm 1 (weight, bias), conv 3, BatchNorm 4 (weight, bias), conv 6
  // (weight, bias)]. The two convolutions reading a recomputed input agree with torch within
  // rounding; every other gradient is torch's kernels on the same tensors, bit for bit. The running
  // statistics move as torch's do.
  const std::vector<std::size_t> recomputed{4, 7};
  check_equal_but_recomputed(model_gradients(model, x), model_gradients(dense, x), recomputed);
  const auto dense_buffers = dense->named_buffers();
  for (const auto& buffer : model->named_buffers()) {
    INFO(buffer.key());
    CHECK(same_values(buffer.value(), dense_buffers[buffer.key()]));
  }

  SUBCASE("channels_last input") {
    const at::Tensor x_last = x.contiguous(at::MemoryFormat::ChannelsLast);
    check_equal_but_recomputed(model_gradients(model, x_last), model_gradients(dense, x_last),
                               recomputed);
  }
  SUBCASE("BatchNorms in eval mode (frozen statistics) inside a model in training") {
    for (auto* net : {&model, &dense})
      for (const std::size_t i : {1, 4}) (**net)[i]->eval();
    CHECK(grad_fn_name(model->forward(x)).find("RecomputingConv2d") != std::string::npos);
    for (const auto& buffer : model->named_buffers()) {  // torch's running statistics in use
      INFO(buffer.key());
      CHECK(same_values(buffer.value(), dense_buffers[buffer.key()]));
    }
    check_equal(model_gradients(model, x), model_gradients(dense, x));
  }
  SUBCASE("the whole model in eval mode runs torch's forward") {
    model->eval();
    dense->eval();
    CHECK(same_values(model->forward(x), dense->forward(x)));
  }
  SUBCASE("a torch ReLU in between breaks the chain: the Conv2d caches") {
    nn::Sequential unconverted_relu = make_conv_stack(11);
    dt::convert(unconverted_relu, ConvertOptions().dropit(DropitOptions().gamma(0.9)));
    CHECK(grad_fn_name(unconverted_relu->forward(x)) == "dropit::Conv2dBackward");
  }
}

TEST_CASE("torch: recompute_layers: BatchNorm2d after a recomputing Conv2d keeps none of it") {
  // The last convolution reads BatchNorm 4 -> ReLU 5, which recomputes through convolution 3.
  converted_conv_stack stack(DropitOptions().gamma(0.9).recompute_layers(true));
  nn::Sequential &dense = stack.dense, &model = stack.model;
  const at::Tensor& x = stack.x;

  // Held: both ReLUs' 1-bit masks (and per-channel statistics); not the BatchNorms' inputs, which
  // convert without recompute_layers keeps. The first convolution keeps its input, the data, as it
  // is (skip_first): the first BatchNorm recomputes its input through it, the second through the
  // middle convolution.
  const std::int64_t held = stack.held, activation = conv_activation;
  CHECK(held >= 2 * activation / 32);
  CHECK(held <= 2 * activation / 32 + 4096);

  // BatchNorm 4's backward reads an input computed again from the first BatchNorm's statistics:
  // every gradient upstream of it agrees with torch's within rounding. The running statistics are
  // the forward's, bit for bit.
  check_equal_but_recomputed(model_gradients(model, x), model_gradients(dense, x), {});
  const auto dense_buffers = dense->named_buffers();
  for (const auto& buffer : model->named_buffers()) {
    INFO(buffer.key());
    CHECK(same_values(buffer.value(), dense_buffers[buffer.key()]));
  }

  SUBCASE("BatchNorms in eval mode recompute with the running statistics, bit for bit") {
    for (auto* net : {&model, &dense})
      for (const std::size_t i : {1, 4}) (**net)[i]->eval();
    CHECK(held_after_forward(model, x) <= 2 * activation / 32 + 4096);
    check_equal(model_gradients(model, x), model_gradients(dense, x));
  }
  SUBCASE("channels_last input") {
    const at::Tensor x_last = x.contiguous(at::MemoryFormat::ChannelsLast);
    check_equal_but_recomputed(model_gradients(model, x_last), model_gradients(dense, x_last), {});
  }
}

TEST_CASE("torch: two layers reading a producer that keeps none of its input recompute it once") {
  // conv (the data, kept as it is) -> BatchNorm -> ReLU, read by two convolutions. Only the
  // BatchNorm recomputes through layers, as the planner sets one block's tools: the convolutions
  // reading its output, with recompute_layers off, recompute that output all the same, and the
  // first convolution runs once in backward for the three of them.
  const auto make = [] {
    ::torch::manual_seed(14);
    return nn::Sequential(nn::Conv2d(nn::Conv2dOptions(3, 16, 3).padding(1).bias(false)),
                          nn::BatchNorm2d(16), nn::ReLU(),
                          nn::Conv2d(nn::Conv2dOptions(16, 8, 3).padding(1)),
                          nn::Conv2d(nn::Conv2dOptions(16, 8, 1)));
  };
  const auto forward = [](nn::Sequential& net, const at::Tensor& input) {
    const auto layer = [&](std::size_t i, const at::Tensor& t) {
      return net->begin()[static_cast<std::ptrdiff_t>(i)].forward<at::Tensor>(t);
    };
    const at::Tensor r = layer(2, layer(1, layer(0, input)));
    return layer(3, r) + layer(4, r);
  };
  nn::Sequential dense = make(), model = make();
  dt::convert(model, ConvertOptions().relu(true).dropit(DropitOptions().gamma(0.9)));
  std::dynamic_pointer_cast<dt::BatchNorm2dImpl>(model->ptr(1))->recompute_layers = true;
  const at::Tensor x = ::torch::randn({4, 3, 12, 12});

  // Held: the ReLU's 1-bit mask and the BatchNorm's per-channel statistics.
  const std::int64_t activation = 4 * 4 * 16 * 12 * 12;
  std::int64_t held = 0;
  for (int step = 0; step < 2; ++step) {
    model->zero_grad(/*set_to_none=*/true);
    const dt::MemoryMeter meter;
    const std::int64_t base = meter.current();
    at::Tensor y = forward(model, x);
    held = meter.current() - base - static_cast<std::int64_t>(y.nbytes());
    CHECK(calls_while("aten::conv2d", [&] { y.square().sum().backward(); }) == 1);
  }
  CHECK(held >= activation / 32);
  CHECK(held <= activation / 32 + 4096);

  // Every gradient upstream of the BatchNorm, and the two convolutions' weights, read tensors
  // recomputed from its statistics: within rounding of torch's.
  const auto gradients_of = [&](nn::Sequential& net) {
    return gradients(*net, x, [&](const at::Tensor& input) { return forward(net, input); });
  };
  check_equal_but_recomputed(gradients_of(model), gradients_of(dense), {});
}

TEST_CASE("torch: recomputation after an affine-free BatchNorm2d without running statistics") {
  const auto make = [] {
    ::torch::manual_seed(13);
    return nn::Sequential(
        nn::Conv2d(nn::Conv2dOptions(3, 8, 3).padding(1).bias(false)),
        nn::BatchNorm2d(nn::BatchNormOptions(8).affine(false).track_running_stats(false)),
        nn::ReLU(), nn::Conv2d(nn::Conv2dOptions(8, 4, 3).padding(1)));
  };
  nn::Sequential dense = make(), model = make();
  dt::convert(model, ConvertOptions().relu(true).dropit(DropitOptions().gamma(0.9)));
  const at::Tensor x = ::torch::randn({4, 3, 10, 10});
  CHECK(grad_fn_name(model->forward(x)).find("RecomputingConv2d") != std::string::npos);
  // Gradients: [x, conv 0, conv 3 (weight, bias)]. Conv 3's weight reads the recomputed input,
  // and its bias gradient is a sum of dZ in another order than torch's backward.
  check_equal_but_recomputed(model_gradients(model, x), model_gradients(dense, x), {2, 3});
}

TEST_CASE("torch: with no autograd node to keep BatchNorm's batch statistics, it recomputes") {
  // A frozen stem and an affine-free BatchNorm on an input that needs no gradient: autograd
  // records nothing up to the ReLU, so no node keeps the batch's statistics. The next convolution
  // still recomputes its input, running the kernel again.
  const auto make = [] {
    ::torch::manual_seed(14);
    nn::Sequential stack(nn::Conv2d(nn::Conv2dOptions(3, 8, 3).padding(1).bias(false)),
                         nn::BatchNorm2d(nn::BatchNormOptions(8).affine(false)), nn::ReLU(),
                         nn::Conv2d(nn::Conv2dOptions(8, 4, 3).padding(1)));
    stack[0]->as<nn::Conv2d>()->weight.set_requires_grad(false);
    return stack;
  };
  nn::Sequential dense = make(), model = make();
  dt::convert(model, ConvertOptions().relu(true).skip_first(false));
  const at::Tensor x = ::torch::randn({4, 3, 10, 10});
  at::Tensor y = model->forward(x);
  CHECK(grad_fn_name(y).find("RecomputingConv2d") != std::string::npos);
  y.square().sum().backward();
  at::Tensor z = dense->forward(x);
  z.square().sum().backward();
  const auto& weight = model[3]->as<dt::Conv2d>()->weight;
  CHECK(same_values(weight.grad(), dense[3]->as<nn::Conv2d>()->weight.grad()));
}

TEST_CASE("torch: dropit's BatchNorm2d rejects an input that is not 4-d, naming its rank") {
  dt::BatchNorm2d norm(nn::BatchNormOptions(4));
  const std::string message = error_message([&] { norm->forward(::torch::randn({2, 4})); });
  CHECK(message.find("4-d input") != std::string::npos);
  CHECK(message.find("got 2 dimensions") != std::string::npos);
}

TEST_CASE("torch: recomputation composes with checkpoint") {
  nn::Sequential dense = make_stack(7), model = make_stack(7);
  dt::convert(model, ConvertOptions().dropit(DropitOptions().gamma(0.9)));
  const at::Tensor x = ::torch::randn({32, 64});
  dt::Checkpoint wrapped(model);
  check_equal(gradients(*wrapped, x, [&](const at::Tensor& t) { return wrapped->forward(t); }),
              model_gradients(dense, x));
}

namespace {

/// conv -> BatchNorm -> ReLU as a module of its own (a Sequential cannot hold a Sequential).
struct ConvNormReluImpl : nn::Module {
  ConvNormReluImpl()
      : layers(register_module(
            "layers",
            nn::Sequential(nn::Conv2d(nn::Conv2dOptions(16, 16, 3).padding(1).bias(false)),
                           nn::BatchNorm2d(16), nn::ReLU()))) {}
  at::Tensor forward(const at::Tensor& x) { return layers->forward(x); }
  nn::Sequential layers;
};
TORCH_MODULE(ConvNormRelu);

}  // namespace

TEST_CASE("torch: a checkpoint whose input BatchNorm2d -> ReLU made recomputes it, keeps nothing") {
  const auto stem = [] { return nn::Conv2d(nn::Conv2dOptions(3, 16, 3).padding(1).bias(false)); };
  ::torch::manual_seed(12);
  nn::Sequential dense(stem(), nn::BatchNorm2d(16), nn::ReLU(), ConvNormRelu());
  ::torch::manual_seed(12);
  nn::Sequential model(stem(), nn::BatchNorm2d(16), nn::ReLU(), dt::Checkpoint(ConvNormRelu()));
  // dropit's BatchNorm and ReLU before the checkpointed block, which stays dense inside.
  const dt::ConvertReport report = dt::convert(model, ConvertOptions().relu(true).exclude("^3\\."));
  CHECK(report.producers == std::vector<std::string>{"1"});
  CHECK(report.converted == std::vector<std::string>{"2"});

  const at::Tensor x = ::torch::randn({4, 3, 16, 16});
  const std::int64_t activation = 4 * 4 * 16 * 16 * 16;
  const std::int64_t dense_held = held_after_forward(dense, x);
  const std::int64_t held = held_after_forward(model, x);
  MESSAGE("held after forward: dense ", dense_held, " B, checkpointed after a producer ", held,
          " B");
  // The first BatchNorm's input and its ReLU's 1-bit mask, the checkpoint's random generator state
  // (5 KiB): not the ReLU's output. Dense holds three activations (the second ReLU's output is the
  // model's, which the loss keeps).
  CHECK(held >= activation + activation / 32);
  CHECK(held <= activation + activation / 32 + 8192);
  CHECK(dense_held >= 3 * activation);
  // The checkpointed block reruns on the recomputed input, and its input gradient flows back to
  // the stem: every gradient within rounding.
  check_equal_but_recomputed(model_gradients(model, x), model_gradients(dense, x), {});
}

namespace {

/// A LayerNorm held by a C++ member, which convert cannot rebind, before a Sequential's Linear.
struct NormThenLinearImpl : nn::Module {
  NormThenLinearImpl()
      : norm(register_module("norm", nn::LayerNorm(nn::LayerNormOptions({16})))),
        body(register_module("body", nn::Sequential(nn::Linear(16, 16), nn::Linear(16, 4)))) {}
  at::Tensor forward(const at::Tensor& x) { return body->forward(norm->forward(x)); }
  nn::LayerNorm norm;
  nn::Sequential body;
};
TORCH_MODULE(NormThenLinear);

}  // namespace

TEST_CASE("torch: convert reports a producer it cannot swap, and why the next Linear caches") {
  NormThenLinear net;
  const dt::ConvertReport report =
      dt::convert(net, ConvertOptions().skip_first(false).dropit(DropitOptions().gamma(0.9)));
  CHECK(report.converted == std::vector<std::string>{"body.0", "body.1"});
  CHECK(report.producers.empty());
  REQUIRE(report.skipped.size() == 1);
  CHECK(report.skipped[0].first == "norm");
  CHECK(report.skipped[0].second.find("producer held by a C++ member") != std::string::npos);
  CHECK(report.skipped[0].second.find("caches") != std::string::npos);
  const dt::ConvertReport off =
      dt::convert(*NormThenLinear(),
                  ConvertOptions().skip_first(false).dropit(DropitOptions().recompute(false)));
  CHECK(off.skipped.empty());  // recompute off: the LayerNorm is no candidate
}

namespace {

/// q, k and v as a transformer's fused projection gives them: views [B, heads, T, head_dim] of one
/// tensor [B, T, 3·heads·head_dim] computed from `x` (so that a forward allocates it).
struct attention_operands {
  at::Tensor q, k, v;
};

attention_operands split_heads(const at::Tensor& projected, std::int64_t heads) {
  const std::int64_t batch = projected.size(0), tokens = projected.size(1);
  const std::int64_t head_dim = projected.size(2) / (3 * heads);
  const at::Tensor parts =
      projected.reshape({batch, tokens, 3, heads, head_dim}).permute({2, 0, 3, 1, 4});
  return {parts[0], parts[1], parts[2]};
}

/// Bytes the graph of `forward` on a fresh leaf copy of `x` holds after forward (the output
/// excluded).
std::int64_t held_by_forward(const std::function<at::Tensor(const at::Tensor&)>& forward,
                             const at::Tensor& x) {
  const at::Tensor input = x.detach().requires_grad_(true);
  dt::MemoryMeter meter;
  const std::int64_t base = meter.current();
  const at::Tensor y = forward(input);
  return meter.current() - base - static_cast<std::int64_t>(y.nbytes());
}

/// A self-attention block: the fused projection, then `attention` on its heads.
nn::Sequential make_attention_block(bool recompute, std::int64_t dim = 32) {
  ::torch::manual_seed(3);
  return nn::Sequential(nn::Linear(dim, 3 * dim),
                        dt::SoftmaxAttention(dt::SoftmaxAttentionOptions().recompute(recompute)));
}

at::Tensor attention_block_forward(nn::Sequential& block, const at::Tensor& x,
                                   std::int64_t heads = 4) {
  const attention_operands o = split_heads(block[0]->as<nn::Linear>()->forward(x), heads);
  return block[1]->as<dt::SoftmaxAttention>()->forward(o.q, o.k, o.v);
}

}  // namespace

TEST_CASE(
    "torch: SoftmaxAttention recomputes its probabilities: torch's results, holding q, k, v") {
  constexpr std::int64_t batch = 8, tokens = 33, dim = 32, heads = 4;
  nn::Sequential dense = make_attention_block(false), recomputing = make_attention_block(true);
  const at::Tensor x = ::torch::randn({batch, tokens, dim});

  // The same kernels on the same operands, the probabilities included: the output bit for bit,
  // and the gradients of the input and the projection's parameters with them.
  const auto forward_of = [&](nn::Sequential& block) {
    return [&](const at::Tensor& input) { return attention_block_forward(block, input); };
  };
  {
    const at::NoGradGuard no_grad;
    CHECK(same_values(attention_block_forward(recomputing, x), attention_block_forward(dense, x)));
  }
  check_equal(gradients(*recomputing, x, forward_of(recomputing)),
              gradients(*dense, x, forward_of(dense)));

  // Held after forward: the projection's output (q, k, v are views of it) and its input; dense
  // also holds the probabilities, [batch, heads, tokens, tokens], and its copies of q, k and v.
  const auto held = [&](nn::Sequential& block) { return held_by_forward(forward_of(block), x); };
  const std::int64_t projected_bytes = 4 * batch * tokens * 3 * dim;
  const std::int64_t probability_bytes = 4 * batch * heads * tokens * tokens;
  const std::int64_t dense_held = held(dense), recomputing_held = held(recomputing);
  MESSAGE("held after forward: dense ", dense_held, " B, recomputing ", recomputing_held, " B");
  CHECK(recomputing_held >= projected_bytes);
  CHECK(recomputing_held <= projected_bytes + 4096);
  CHECK(dense_held - recomputing_held >= probability_bytes);

  // Without gradients, or under autocast, it is torch's operations.
  const at::Tensor q = ::torch::randn({2, 5, 8}), k = ::torch::randn({2, 7, 8}),
                   v = ::torch::randn({2, 7, 3});
  const at::Tensor plain =
      at::matmul((at::matmul(q, k.transpose(-2, -1)) / std::sqrt(8.0)).softmax(-1), v);
  CHECK(same_values(dt::softmax_attention(q, k, v), plain));
  {
    const cpu_autocast_bfloat16 autocast;
    const at::Tensor qg = q.detach().requires_grad_(true);
    const at::Tensor got = dt::softmax_attention(qg, k, v);
    const at::Tensor want =
        at::matmul((at::matmul(qg, k.transpose(-2, -1)) / std::sqrt(8.0)).softmax(-1), v);
    CHECK(same_values(got, want));
  }
}

TEST_CASE("torch: softmax_attention rejects operands that do not fit, naming their sizes") {
  const at::Tensor q = ::torch::randn({2, 5, 8}), k = ::torch::randn({2, 7, 8}),
                   v = ::torch::randn({2, 7, 3});
  CHECK_DROPIT_ERROR(dt::softmax_attention(::torch::randn({8}), k, v), "q has 1 dimension",
                     "at least 2");
  CHECK_DROPIT_ERROR(dt::softmax_attention(q, ::torch::randn({2, 7, 6}), v), "q has 8 features",
                     "k 6");
  CHECK_DROPIT_ERROR(dt::softmax_attention(q, k, ::torch::randn({2, 6, 3})), "k has 7 tokens",
                     "v 6");
  CHECK_DROPIT_ERROR(dt::softmax_attention(q, ::torch::randn({3, 7, 8}), v), "axis 0",
                     "2 (q), 3 (k)");
  CHECK_DROPIT_ERROR(dt::softmax_attention(q, k.unsqueeze(0), v), "3, 4 and 3 dimensions");
  CHECK_DROPIT_ERROR(dt::softmax_attention(q, k.to(at::kDouble), v), "Float, Double", "one dtype");
  CHECK_DROPIT_ERROR(dt::SoftmaxAttention(dt::SoftmaxAttentionOptions().recompute(false))
                         ->forward(q, ::torch::randn({2, 7, 6}), v),
                     "q has 8 features");
}

TEST_CASE("torch: convert makes a SoftmaxAttention in a Sequential recompute, and reports it") {
  nn::Sequential model = make_attention_block(false);
  const dt::ConvertReport report = dt::convert(model, ConvertOptions().skip_first(false));
  CHECK(report.converted == std::vector<std::string>{"0"});
  CHECK(report.attention == std::vector<std::string>{"1"});
  CHECK(model[1]->as<dt::SoftmaxAttention>()->options.recompute());
  std::ostringstream printed;
  printed << report;
  CHECK(printed.str().find("~ 1: attention, its probabilities recomputed") != std::string::npos);

  nn::Sequential excluded = make_attention_block(false);
  const dt::ConvertReport left = dt::convert(excluded, ConvertOptions().exclude("^1$"));
  CHECK(left.attention.empty());
  CHECK(!excluded[1]->as<dt::SoftmaxAttention>()->options.recompute());
  nn::Sequential off = make_attention_block(false);
  CHECK(dt::convert(off, ConvertOptions().dropit(DropitOptions().recompute(false)))
            .attention.empty());
  CHECK(!off[1]->as<dt::SoftmaxAttention>()->options.recompute());
}

namespace {

constexpr std::int64_t attention_dim = 32, attention_heads = 4;

/// LayerNorm -> the fused q, k, v projection -> SoftmaxAttention, as a transformer block begins.
nn::Sequential make_normed_attention(bool only_through_layers = false) {
  ::torch::manual_seed(5);
  return nn::Sequential(
      nn::LayerNorm(nn::LayerNormOptions({attention_dim})),
      nn::Linear(attention_dim, 3 * attention_dim),
      dt::SoftmaxAttention(
          dt::SoftmaxAttentionOptions().recompute(false).only_through_layers(only_through_layers)));
}

/// Its forward, through the Sequential's slots (whatever convert put there). As a transformer's
/// attention module does, it keeps only the heads' views of the projection's output, not the
/// output itself (a [B, T, 3D] view of the [B·T, 3D] product, gone before the attention runs).
at::Tensor normed_attention_forward(nn::Sequential& block, const at::Tensor& x) {
  const auto slot = [&](std::ptrdiff_t i) -> nn::AnyModule& { return *(block->begin() + i); };
  const attention_operands o =
      split_heads(slot(1).forward<at::Tensor>(slot(0).forward<at::Tensor>(x)), attention_heads);
  return slot(2).forward<at::Tensor>(o.q, o.k, o.v);
}

}  // namespace

TEST_CASE(
    "torch: recompute_layers: SoftmaxAttention after LayerNorm -> projection keeps no q, k, v") {
  constexpr std::int64_t batch = 4, tokens = 9;
  // only_through_layers changes nothing here: q, k and v are computed again through the layer.
  for (const bool only_through_layers : {false, true}) {
    CAPTURE(only_through_layers);
    nn::Sequential dense = make_normed_attention(), converted = make_normed_attention(),
                   through = make_normed_attention(only_through_layers);
    dt::convert(converted, ConvertOptions().skip_first(false));
    const dt::ConvertReport report = dt::convert(
        through, ConvertOptions().skip_first(false).dropit(DropitOptions().recompute_layers(true)));
    CHECK((only_through_layers ? report.attention_through_layers : report.attention) ==
          std::vector<std::string>{"2"});
    CHECK(through[2]->as<dt::SoftmaxAttention>()->recompute_layers);
    const auto forward_of = [](nn::Sequential& block) {
      return [&](const at::Tensor& x) { return normed_attention_forward(block, x); };
    };

    const at::Tensor x = ::torch::randn({batch, tokens, attention_dim});
    const auto held = [&](nn::Sequential& block) { return held_by_forward(forward_of(block), x); };
    // Converted, the attention keeps the projection's output (q, k, v are views of it); recomputing
    // through the projection, only LayerNorm's per-row statistics stay (its input is the caller's).
    const std::int64_t projected_bytes = 4 * batch * tokens * 3 * attention_dim;
    const std::int64_t statistics_bytes = 4 * batch * tokens * 2;
    const std::int64_t converted_held = held(converted), through_held = held(through);
    MESSAGE("held after forward: converted ", converted_held, " B, through the projection ",
            through_held, " B");
    CHECK(converted_held >= projected_bytes);
    CHECK(through_held <= statistics_bytes + 4096);

    // The projection runs once more in backward, on LayerNorm's output computed again (which the
    // projection's own weight gradient takes too): the same kernels, gradients bit for bit.
    std::vector<at::Tensor> got;
    const int linears =
        calls_while("aten::linear", [&] { got = gradients(*through, x, forward_of(through)); });
    CHECK(linears == 2);
    const std::vector<at::Tensor> want = gradients(*dense, x, forward_of(dense));
    check_equal(got, want);
    check_equal(gradients(*converted, x, forward_of(converted)), want);
  }
}

TEST_CASE(
    "torch: SoftmaxAttention with only_through_layers keeps its probabilities where q, k and v "
    "stay") {
  constexpr std::int64_t batch = 4, tokens = 9;
  nn::Sequential dense = make_normed_attention(), recomputing = make_normed_attention(),
                 keeping = make_normed_attention(/*only_through_layers=*/true);
  dt::convert(recomputing, ConvertOptions().skip_first(false));
  const dt::ConvertReport report = dt::convert(keeping, ConvertOptions().skip_first(false));
  CHECK(report.attention.empty());
  CHECK(report.attention_through_layers == std::vector<std::string>{"2"});
  std::ostringstream printed;
  printed << report;
  CHECK(printed.str().find("~ 2: attention, its probabilities kept unless q, k and v are "
                           "recomputed through their projection (recompute_layers)") !=
        std::string::npos);
  const auto forward_of = [](nn::Sequential& block) {
    return [&](const at::Tensor& x) { return normed_attention_forward(block, x); };
  };

  // Without recompute_layers it is torch's attention: it keeps the probabilities, which the
  // attention recomputing them does not, and computes torch's gradients bit for bit.
  const at::Tensor x = ::torch::randn({batch, tokens, attention_dim});
  const auto held = [&](nn::Sequential& block) { return held_by_forward(forward_of(block), x); };
  const std::int64_t probability_bytes = 4 * batch * attention_heads * tokens * tokens;
  const std::int64_t keeping_held = held(keeping), recomputing_held = held(recomputing);
  MESSAGE("held after forward: keeping the probabilities ", keeping_held, " B, recomputing them ",
          recomputing_held, " B");
  CHECK(keeping_held - recomputing_held >= probability_bytes);
  std::vector<at::Tensor> got;
  const int softmaxes =
      calls_while("aten::softmax", [&] { got = gradients(*keeping, x, forward_of(keeping)); });
  CHECK(softmaxes == 1);  // the forward's only
  check_equal(got, gradients(*dense, x, forward_of(dense)));
}
