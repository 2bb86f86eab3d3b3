// A program using dropit::torch_cuda from a project that embeds dropit: the LibTorch adapters on
// CUDA tensors, compiled by the host compiler, reaching the kernels that nvcc compiled from
// dropit/cuda_instances.cu. At gamma 0 the layers keep every element, so their outputs and every
// gradient must equal torch's own layers under autograd; at gamma 0.9 a Linear must hold far less
// after forward than torch's, measured at the caching allocator. The C++ tools beyond the layers
// run on CUDA tensors too: exact recomputation (after LayerNorm, GELU and BatchNorm -> ReLU, and
// through layers), Checkpoint with dropout replayed from the CUDA generator, the memory planner,
// and the layers under CUDA autocast. Exits 77 (ctest: skipped) without a CUDA device.
#include <torch/cuda.h>
#include <dropit/torch.hpp>

#include <ATen/autocast_mode.h>

#include <functional>
#include <iostream>
#include <string>
#include <vector>

namespace dt = dropit::torch;

namespace {

int failures = 0;

void expect(bool condition, const std::string& what) {
  if (condition) return;
  ++failures;
  std::cout << what << '\n';
}

void expect_close(const std::string& what, const torch::Tensor& actual,
                  const torch::Tensor& expected, double rtol = 1e-4, double atol = 1e-5) {
  if (actual.sizes() == expected.sizes() &&
      torch::allclose(actual.cpu().to(torch::kDouble), expected.cpu().to(torch::kDouble), rtol,
                      atol))
    return;
  ++failures;
  std::cout << what << " differs from torch's: max |difference| "
            << (actual.cpu().to(torch::kDouble) - expected.cpu().to(torch::kDouble))
                   .abs()
                   .max()
                   .item<double>()
            << '\n';
}

/// Within `rel` of the reference's largest magnitude: sums formed in another order (cuDNN's
/// algorithms, a BatchNorm output recomputed from its statistics) agree so, not elementwise.
void expect_near(const std::string& what, const torch::Tensor& actual,
                 const torch::Tensor& expected, double rel) {
  const double scale = expected.abs().max().item<double>();
  const double difference =
      (actual.to(torch::kDouble) - expected.to(torch::kDouble)).abs().max().item<double>();
  expect(actual.sizes() == expected.sizes() && difference <= rel * scale,
         what + " differs from torch's by " + std::to_string(difference) + " (largest magnitude " +
             std::to_string(scale) + ")");
}

/// Gives torch's layer the dropit layer's weight and bias.
template <class DropitLayer, class TorchLayer>
void copy_parameters(DropitLayer& layer, TorchLayer& dense) {
  torch::NoGradGuard no_grad;
  dense->weight.copy_(layer->weight);
  dense->bias.copy_(layer->bias);
}

/// Runs the same input through a dropit layer and torch's, sharing parameters, and compares the
/// output and the gradients of the input and of every parameter.
template <class DropitLayer, class TorchLayer>
void expect_same_as_torch(const char* name, DropitLayer& layer, TorchLayer& dense,
                          const torch::Tensor& input) {
  copy_parameters(layer, dense);
  const torch::Tensor x1 = input.clone().requires_grad_(true);
  const torch::Tensor x2 = input.clone().requires_grad_(true);
  const torch::Tensor y1 = layer->forward(x1), y2 = dense->forward(x2);
  y1.square().sum().backward();
  y2.square().sum().backward();
  const std::string prefix = name;
  expect_close(prefix + " output", y1, y2);
  expect_close(prefix + " input gradient", x1.grad(), x2.grad());
  expect_close(prefix + " weight gradient", layer->weight.grad(), dense->weight.grad());
  expect_close(prefix + " bias gradient", layer->bias.grad(), dense->bias.grad());
}

/// Bytes a layer's forward leaves allocated (its saved tensors and the output), the input freed.
template <class Layer>
std::int64_t held_after_forward(Layer& layer, const torch::Device& device) {
  dt::MemoryMeter meter(device);
  const std::int64_t before = meter.current();
  const torch::Tensor y = layer->forward(torch::relu(torch::randn({8192, 1024}, device)));
  return meter.current() - before;
}

namespace nn = torch::nn;
using make_model = std::function<nn::Sequential()>;

/// linear -> LayerNorm -> linear -> GELU -> linear, the same parameters for every call.
nn::Sequential make_stack() {
  torch::manual_seed(1);
  return nn::Sequential(nn::Linear(64, 256), nn::LayerNorm(nn::LayerNormOptions({256})),
                        nn::Linear(256, 512), nn::GELU(), nn::Linear(512, 64));
}

/// conv -> BatchNorm -> ReLU -> conv -> BatchNorm -> ReLU -> conv; no bias before a BatchNorm
/// (its gradient would be rounding noise about zero).
nn::Sequential make_cnn() {
  torch::manual_seed(2);
  auto conv = [](std::int64_t in, bool bias) {
    return nn::Conv2d(nn::Conv2dOptions(in, 16, 3).padding(1).bias(bias));
  };
  return nn::Sequential(conv(3, false), nn::BatchNorm2d(16), nn::ReLU(), conv(16, false),
                        nn::BatchNorm2d(16), nn::ReLU(), conv(16, true));
}

/// The gradients of sum(y²) with respect to the input and every parameter.
std::vector<torch::Tensor> gradients(nn::Sequential& model, const torch::Tensor& input) {
  model->zero_grad();
  const torch::Tensor x = input.detach().requires_grad_(true);
  model->forward(x).square().sum().backward();
  std::vector<torch::Tensor> grads{x.grad().clone()};
  for (const auto& p : model->parameters()) grads.push_back(p.grad().clone());
  return grads;
}

void expect_same_gradients(const std::string& what, nn::Sequential& model, nn::Sequential& dense,
                           const torch::Tensor& x, double rel) {
  const auto got = gradients(model, x), want = gradients(dense, x);
  expect(got.size() == want.size(), what + ": another number of gradients");
  for (std::size_t i = 0; i < got.size() && i < want.size(); ++i)
    expect_near(what + " gradient " + std::to_string(i), got[i], want[i], rel);
}

/// Bytes the graph holds after forward (the output excluded), on the step after a first one.
std::int64_t held_after_forward(nn::Sequential& model, const torch::Tensor& x) {
  std::int64_t held = 0;
  for (int step = 0; step < 2; ++step) {
    model->zero_grad(/*set_to_none=*/true);
    dt::MemoryMeter meter(x.device());
    const std::int64_t base = meter.current();
    const torch::Tensor y = model->forward(x);
    held = meter.current() - base - static_cast<std::int64_t>(y.nbytes());
    y.square().sum().backward();
  }
  return held;
}

/// Converted at gamma 0.9, every layer of these models recomputes its input exactly (the first
/// keeps the model's input): the gradients are dense's, and what stays held is the producers'.
void check_recomputation(const char* name, const make_model& make, const torch::Tensor& x,
                         double max_held_ratio, double rel) {
  nn::Sequential dense = make();
  dense->to(x.device());
  const std::int64_t dense_held = held_after_forward(dense, x);
  for (const bool through_layers : {false, true}) {
    nn::Sequential model = make();
    dt::convert(model, dt::ConvertOptions().relu(true).dropit(
                           dt::DropitOptions().gamma(0.9).recompute_layers(through_layers)));
    model->to(x.device());
    const std::string what =
        std::string(name) + (through_layers ? ", recomputing through layers" : ", recomputing");
    const std::int64_t held = held_after_forward(model, x);
    expect(static_cast<double>(held) <= max_held_ratio * static_cast<double>(dense_held),
           what + " holds " + std::to_string(held) + " B after forward, dense " +
               std::to_string(dense_held));
    expect_same_gradients(what, model, dense, x, rel);
  }
}

/// A block with dropout, checkpointed (nested once) and not: the CUDA generator is replayed, so
/// the gradients are equal.
void check_checkpoint(const torch::Device& cuda) {
  auto make = [&](bool checkpointed) {
    torch::manual_seed(3);
    nn::Linear first(16, 32), second(32, 64), last(64, 8);
    nn::Sequential model;
    if (checkpointed) {
      dt::Checkpoint inner(nn::Sequential(second, nn::Dropout(0.5), nn::GELU()));
      model->push_back(dt::Checkpoint(nn::Sequential(first, nn::Dropout(0.3), nn::ReLU(), inner)));
    } else {
      model =
          nn::Sequential(first, nn::Dropout(0.3), nn::ReLU(), second, nn::Dropout(0.5), nn::GELU());
    }
    model->push_back(last);
    model->to(cuda);
    return model;
  };
  nn::Sequential plain = make(false), checkpointed = make(true);
  const torch::Tensor x = torch::randn({128, 16}, cuda);
  torch::manual_seed(4);
  const auto want = gradients(plain, x);
  torch::manual_seed(4);
  const auto got = gradients(checkpointed, x);
  expect(got.size() == want.size(), "Checkpoint: another number of gradients");
  for (std::size_t i = 0; i < got.size() && i < want.size(); ++i)
    expect_close("Checkpoint gradient " + std::to_string(i), got[i], want[i]);
}

/// The planner on a CUDA model: the plan meets its budget as the allocator measures it afterwards.
void check_plan(const torch::Device& cuda) {
  const torch::Tensor x = torch::randn({32, 3, 32, 32}, cuda);
  nn::Sequential dense = make_cnn();
  dense->to(cuda);
  const std::int64_t dense_held = held_after_forward(dense, x);
  nn::Sequential model = make_cnn();
  model->to(cuda);
  const dt::MemoryPlan plan = dt::plan_memory(
      *model, [&] { return model->forward(x).square().mean(); },
      dt::PlanOptions().budget(0.5).timing_rounds(3));
  std::cout << plan << '\n';
  const std::int64_t held = held_after_forward(model, x);
  expect(plan.met && static_cast<double>(held) <= 0.5 * static_cast<double>(dense_held),
         "plan_memory at budget 0.5: the planned model holds " + std::to_string(held) +
             " B after forward, dense " + std::to_string(dense_held));
}

/// Under CUDA autocast a layer computes in bfloat16 as torch's does: same output dtype, float32
/// parameter gradients, values within bfloat16 rounding.
template <class DropitLayer, class TorchLayer>
void check_autocast(const char* name, DropitLayer& layer, TorchLayer& dense,
                    const torch::Tensor& input) {
  copy_parameters(layer, dense);
  at::autocast::set_autocast_dtype(at::kCUDA, at::kBFloat16);
  at::autocast::set_autocast_enabled(at::kCUDA, true);
  const torch::Tensor y1 = layer->forward(input), y2 = dense->forward(input);
  at::autocast::set_autocast_enabled(at::kCUDA, false);
  at::autocast::clear_cache();
  const std::string prefix = std::string(name) + " under autocast";
  expect(y1.scalar_type() == y2.scalar_type(), prefix + ": output dtype differs from torch's");
  y1.to(torch::kFloat).square().sum().backward();
  y2.to(torch::kFloat).square().sum().backward();
  expect(layer->weight.grad().scalar_type() == torch::kFloat,
         prefix + ": weight gradient is not float32");
  expect_near(prefix + " output", y1.to(torch::kFloat), y2.to(torch::kFloat), 1e-2);
  expect_near(prefix + " weight gradient", layer->weight.grad(), dense->weight.grad(), 2e-2);
}

}  // namespace

int main() {
  if (!torch::cuda::is_available()) {
    std::cout << "dropit::torch_cuda consumer: no CUDA device: skipped\n";
    return 77;
  }
  const torch::Device cuda(torch::kCUDA);
  torch::manual_seed(0);

  dt::Linear linear(torch::nn::LinearOptions(64, 32), dt::DropitOptions().gamma(0.0));
  torch::nn::Linear dense_linear(torch::nn::LinearOptions(64, 32));
  linear->to(cuda);
  dense_linear->to(cuda);
  expect_same_as_torch("Linear", linear, dense_linear, torch::randn({16, 64}, cuda));

  dt::Conv2d conv(torch::nn::Conv2dOptions(4, 8, 3).padding(1), dt::DropitOptions().gamma(0.0));
  torch::nn::Conv2d dense_conv(torch::nn::Conv2dOptions(4, 8, 3).padding(1));
  conv->to(cuda);
  dense_conv->to(cuda);
  expect_same_as_torch("Conv2d", conv, dense_conv, torch::randn({2, 4, 10, 10}, cuda));

  dt::Linear sparse(torch::nn::LinearOptions(1024, 1024), dt::DropitOptions().gamma(0.9));
  torch::nn::Linear dense(torch::nn::LinearOptions(1024, 1024));
  sparse->to(cuda);
  dense->to(cuda);
  const std::int64_t sparse_bytes = held_after_forward(sparse, cuda);
  const std::int64_t dense_bytes = held_after_forward(dense, cuda);
  // Dense holds the output and the whole input (2 x 32 MiB); at gamma 0.9 the cache is about a
  // tenth of the input plus its positions.
  if (!(sparse_bytes < 0.7 * static_cast<double>(dense_bytes))) {
    ++failures;
    std::cout << "Linear gamma 0.9 holds " << sparse_bytes << " bytes after forward, dense "
              << dense_bytes << '\n';
  }

  // cuDNN's deterministic algorithms: a model and its dense twin sum in the same order.
  at::globalContext().setDeterministicCuDNN(true);
  // Held: the LayerNorm's and the GELU's inputs (0.56x dense); through layers, their statistics.
  check_recomputation("linear-LayerNorm-linear-GELU-linear", make_stack,
                      torch::randn({256, 64}, cuda), 0.56, 1e-5);
  // After BatchNorm -> ReLU the input is recomputed from the batch's statistics: within rounding.
  check_recomputation("conv-BatchNorm-ReLU CNN", make_cnn, torch::randn({16, 3, 24, 24}, cuda), 0.7,
                      1e-4);
  check_checkpoint(cuda);
  check_plan(cuda);
  {
    dt::Linear autocast_linear(torch::nn::LinearOptions(64, 48), dt::DropitOptions().gamma(0.0));
    torch::nn::Linear autocast_dense(torch::nn::LinearOptions(64, 48));
    autocast_linear->to(cuda);
    autocast_dense->to(cuda);
    check_autocast("Linear", autocast_linear, autocast_dense, torch::randn({32, 64}, cuda));
    dt::Conv2d autocast_conv(torch::nn::Conv2dOptions(4, 8, 3).padding(1),
                             dt::DropitOptions().gamma(0.0));
    torch::nn::Conv2d autocast_dense_conv(torch::nn::Conv2dOptions(4, 8, 3).padding(1));
    autocast_conv->to(cuda);
    autocast_dense_conv->to(cuda);
    check_autocast("Conv2d", autocast_conv, autocast_dense_conv,
                   torch::randn({4, 4, 12, 12}, cuda));
  }

  std::cout << "dropit::torch_cuda consumer: "
            << (failures ? "FAILED" : "layers, recomputation, checkpoint, planner equal torch's")
            << " on " << static_cast<int>(torch::cuda::device_count()) << " CUDA device(s)\n";
  return failures ? 1 : 0;
}
