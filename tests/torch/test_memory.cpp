// MemoryMeter, and the peak memory of real training steps measured at the allocator.

#include "torch_helpers.hpp"

namespace {

using namespace torch_test;
using dt::ConvertOptions;
using dt::DropitOptions;
namespace nn = ::torch::nn;

constexpr double MiB = 1024.0 * 1024.0;

}  // namespace

TEST_CASE("torch: an operation's workspace is its own, nested or large, and none for 0 bytes") {
  const at::Tensor cpu_tensor = at::zeros({1});
  const auto disjoint = [](dropit::workspace a, dropit::workspace b) {
    return a.data() + a.size() <= b.data() || b.data() + b.size() <= a.data();
  };
  const dt::scoped_workspace none(0, cpu_tensor);
  CHECK(none.span().empty());
  constexpr std::size_t small = 4096;
  const dt::scoped_workspace outer(small, cpu_tensor);
  REQUIRE(outer.span().size() == small);
  // Twice: the end of the first nested workspace must leave the outer one's memory taken.
  for (int nested_scope = 0; nested_scope < 2; ++nested_scope) {
    CAPTURE(nested_scope);
    const dt::scoped_workspace nested(small, cpu_tensor);
    REQUIRE(nested.span().size() == small);
    CHECK(disjoint(outer.span(), nested.span()));
  }
  const std::size_t large = dt::scoped_workspace::thread_buffer_bytes + 1;
  const dt::scoped_workspace big(large, cpu_tensor);
  REQUIRE(big.span().size() == large);
  CHECK(disjoint(outer.span(), big.span()));
}

TEST_CASE("torch: MemoryMeter counts the bytes of live tensors and their peak") {
  dt::MemoryMeter meter;
  const std::int64_t start = meter.current();
  CHECK(meter.peak() == start);  // a new meter starts its peak at the present
  for (const std::int64_t n : {std::int64_t{1}, std::int64_t{1000}, std::int64_t{1} << 20}) {
    CAPTURE(n);
    at::Tensor t = ::torch::empty({n}, at::kFloat);
    CHECK(meter.current() - start == 4 * n);
    CHECK(meter.peak() >= start + 4 * n);
    t.reset();
    CHECK(meter.current() == start);
  }
  meter.reset_peak();
  CHECK(meter.peak() == start);
  {
    at::Tensor a = ::torch::zeros({3000}, at::kFloat);    // 12000 B
    at::Tensor b = ::torch::zeros({500}, at::kBFloat16);  // 1000 B
    CHECK(meter.current() - start == 13000);
    a.reset();
    at::Tensor c = ::torch::zeros({100}, at::kDouble);  // 800 B
    CHECK(meter.current() - start == 1800);
    CHECK(meter.peak() - start == 13000);  // the high-water mark stays
  }
  CHECK(meter.current() == start);
  meter.reset_peak();
  CHECK(meter.peak() == start);
  // Views and in-place operations allocate nothing.
  at::Tensor base = ::torch::ones({64, 64});
  const std::int64_t with_base = meter.current();
  at::Tensor view = base.t().slice(0, 0, 10);
  base.mul_(2);
  CHECK(meter.current() == with_base);
  // A second meter reads the same process-wide counter.
  dt::MemoryMeter other;
  CHECK(other.current() == meter.current());
}

namespace {

struct step_memory {
  std::int64_t held = 0;    // bytes the graph holds after forward, beyond what existed before
  std::int64_t peak = 0;    // peak during forward + backward, beyond what existed before
  std::int64_t output = 0;  // bytes of the model's output (part of `held`)
};

/// One training step (forward, squared-error loss, backward) measured at the allocator. Parameter
/// gradients are reset to none first, so both models allocate them inside the step.
template <class Model>
step_memory measure_step(Model& model, const at::Tensor& x) {
  dt::MemoryMeter meter;
  model->zero_grad(/*set_to_none=*/true);
  const std::int64_t base = meter.current();
  meter.reset_peak();
  step_memory m;
  {
    at::Tensor y = model->forward(x);
    at::Tensor loss = y.square().mean();
    m.held = meter.current() - base;
    m.output = static_cast<std::int64_t>(y.nbytes());
    loss.backward();
  }
  m.peak = meter.peak() - base;
  return m;
}

/// Dense model and its dropit conversion (γ = 0.9, chunked min-k with the default D = 2^14, 1-bit
/// ReLU; the first layer stays dense), a warm-up step each (so lazily initialised state is not
/// measured), then one measured step each. With `conv_only`, also a conversion that leaves torch's
/// ReLU in place.
struct comparison {
  step_memory dense, dropit, conv_only;
};

comparison compare(nn::Sequential& dense, const at::Tensor& x, const std::string& what) {
  auto converted_copy = [&](bool relu) {
    nn::Sequential copy = std::dynamic_pointer_cast<nn::SequentialImpl>(dense->clone());
    const auto report =
        dt::convert(copy, ConvertOptions().dropit(DropitOptions().gamma(0.9)).relu(relu));
    REQUIRE(!report.converted.empty());
    return copy;
  };
  nn::Sequential converted = converted_copy(true), conv_only = converted_copy(false);
  comparison c;
  for (int repeat = 0; repeat < 2; ++repeat) {
    c.dense = measure_step(dense, x);
    c.dropit = measure_step(converted, x);
    c.conv_only = measure_step(conv_only, x);
  }
  auto saved = [](const step_memory& m) { return double(m.held - m.output) / MiB; };
  MESSAGE(what, ": output ", c.dense.output / MiB,
          " MiB; saved for backward (held after forward "
          "minus the output): dense ",
          saved(c.dense), " MiB, dropit ", saved(c.dropit), " MiB (",
          saved(c.dropit) / saved(c.dense), "), dropit layers with torch's ReLU ",
          saved(c.conv_only), " MiB; peak of the step: dense ", c.dense.peak / MiB, " MiB, dropit ",
          c.dropit.peak / MiB, " MiB (", double(c.dropit.peak) / c.dense.peak, ")");
  return c;
}

/// |measured - predicted| within `rel` of predicted.
void check_near(double measured, double predicted, double rel, const char* what) {
  CHECK_MESSAGE(std::abs(measured - predicted) <= rel * predicted, what, ": measured ",
                measured / MiB, " MiB, predicted ", predicted / MiB, " MiB");
}

// Bytes per fp32 element that dropit keeps at γ = 0.9 (docs/api.md, "Memory per cached element"):
// chunked min-k keeps 0.1 of the values (0.4 B) and a 1-bit mask of positions (0.125 B) =
// 0.525 B, where the bitmask is smaller than uint16 offsets (0.6 B). The 1-bit ReLU keeps 0.125 B
// where torch's keeps its 4-byte output.
constexpr double cache_bytes_per_element = 0.1 * 4 + 1.0 / 8;
constexpr double relu_bytes_per_element = 1.0 / 8;

}  // namespace

// An MLP / transformer-FFN-like stack: 8 Linear(256, 256) with ReLU between, 4096 rows.
// A = 4096·256·4 B = 4 MiB is one activation; the input x exists before the step (not counted).
//
// Saved for backward. Dense: the 7 hidden activations, each kept once (ReLU's output is the next
// Linear's input) = 7A. dropit: Linear 1 stays dense and saves x (no new memory); Linears 2-8 keep
// 7 caches of 0.525 B/element and the 7 ReLUs a 1-bit mask: 7·(0.525 + 0.125)/4·A = 1.14A.
//
// Peak = saved + output O (A, kept by the squared loss) + what backward adds on top, T: parameter
// gradients P (8·256²·4 B = 0.5A) plus at most ~4A of gradient buffers (loss gradient, dZ, dX, the
// ReLU-backward result), the same for both; dropit adds its dW workspace W, live inside one layer's
// backward: 20 B per kept value (decoded position, value, column regrouping) = 0.5A, plus a
// 256²-float accumulator. The ratio (1.14 + 1 + T + 0.5)/(7 + 1 + T) grows with T; at T = 4.5A it
// is 7.14/12.5 = 0.57. Threshold 0.65 leaves slack for allocator rounding and torch's temporaries;
// a dense cache (>= 4 B/element) would make the ratio >= 1.
TEST_CASE("torch: measured peak memory of an MLP training step at gamma 0.9") {
  const std::int64_t rows = 4096, width = 256, layers = 8;
  ::torch::manual_seed(1);
  nn::Sequential model;
  for (std::int64_t i = 0; i < layers; ++i) {
    model->push_back(nn::Linear(width, width));
    if (i + 1 < layers) model->push_back(nn::ReLU());
  }
  const at::Tensor x = ::torch::randn({rows, width});
  const comparison c = compare(model, x, "MLP 8 x Linear(256, 256), 4096 rows");
  const double a = double(rows * width * 4);
  check_near(double(c.dense.held - c.dense.output), 7 * a, 0.02, "dense saved");
  check_near(double(c.dropit.held - c.dropit.output),
             7 * (cache_bytes_per_element + relu_bytes_per_element) / 4 * a, 0.02, "dropit saved");
  CHECK(c.dropit.peak <= 0.65 * c.dense.peak);
}

// A ResNet-style stack without BatchNorm: 8 x (Conv2d 32->32 3x3 pad 1, ReLU) on 16 x 32 x 32 x 32.
// A = 16·32·32·32·4 B = 2 MiB; the input x (A) exists before the step.
//
// Saved. Dense: Conv2d saves its input, ReLU its output, the same tensor: 7 hidden activations =
// 7A (the 8th ReLU's output is the model output O = A). dropit: conv 1 stays dense (saves x),
// convs 2-8 keep 7 caches of 0.525 B/element, the 8 ReLUs 1-bit masks:
// (7·0.525 + 8·0.125)/4·A = 1.17A. With torch's ReLU left in place the conv caches free nothing:
// ReLU keeps the same activations alive, and the caches come on top.
//
// Peak = saved + O + T, T = parameter gradients (8·32·32·9·4 B = 0.14A) + at most ~4A of gradient
// buffers, the same for both; dropit's conv dW workspace W is a float copy of dZ (A) plus 12 B per
// kept value (0.3A). (1.17 + 1 + T + 1.3)/(7 + 1 + T) at T = 4.14A is 7.61/12.14 = 0.63; threshold
// 0.7, where a dense cache would give >= 1.
TEST_CASE("torch: measured peak memory of a ResNet-style conv stack at gamma 0.9") {
  const std::int64_t batch = 16, channels = 32, side = 32, convs = 8;
  ::torch::manual_seed(2);
  nn::Sequential model;
  for (std::int64_t i = 0; i < convs; ++i) {
    model->push_back(nn::Conv2d(nn::Conv2dOptions(channels, channels, 3).padding(1)));
    model->push_back(nn::ReLU());
  }
  const at::Tensor x = ::torch::randn({batch, channels, side, side});
  const comparison c = compare(model, x, "conv stack 8 x (Conv2d 3x3, ReLU), 16 x 32 x 32 x 32");
  const double a = double(batch * channels * side * side * 4);
  check_near(double(c.dense.held - c.dense.output), 7 * a, 0.02, "dense saved");
  check_near(double(c.dropit.held - c.dropit.output),
             (7 * cache_bytes_per_element + 8 * relu_bytes_per_element) / 4 * a, 0.02,
             "dropit saved");
  // Without the 1-bit ReLU nothing is freed: the caches come on top of ReLU's saved outputs.
  CHECK(c.conv_only.held >= c.dense.held);
  CHECK(c.dropit.peak <= 0.7 * c.dense.peak);
}
