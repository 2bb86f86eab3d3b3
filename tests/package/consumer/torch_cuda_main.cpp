// A program using dropit::torch_cuda from a project that embeds dropit: the LibTorch adapters on
// CUDA tensors, compiled by the host compiler, reaching the kernels that nvcc compiled from
// dropit/cuda_instances.cu. At gamma 0 the layers keep every element, so their outputs and every
// gradient must equal torch's own layers under autograd; at gamma 0.9 a Linear must hold far less
// after forward than torch's, measured at the caching allocator. Exits 77 (ctest: skipped)
// without a CUDA device.
#include <dropit/torch.hpp>
#include <torch/cuda.h>

#include <iostream>

namespace dt = dropit::torch;

namespace {

int failures = 0;

void expect_close(const char* what, const torch::Tensor& actual, const torch::Tensor& expected) {
  if (torch::allclose(actual.cpu(), expected.cpu(), 1e-4, 1e-5)) return;
  ++failures;
  std::cout << what << " differs from torch's: max |difference| "
            << (actual.cpu() - expected.cpu()).abs().max().item<double>() << '\n';
}

/// Runs the same input through a dropit layer and torch's, sharing parameters, and compares the
/// output and the gradients of the input and of every parameter.
template <class DropitLayer, class TorchLayer>
void expect_same_as_torch(const char* name, DropitLayer& layer, TorchLayer& dense,
                          const torch::Tensor& input) {
  {
    torch::NoGradGuard no_grad;
    dense->weight.copy_(layer->weight);
    dense->bias.copy_(layer->bias);
  }
  const torch::Tensor x1 = input.clone().requires_grad_(true);
  const torch::Tensor x2 = input.clone().requires_grad_(true);
  const torch::Tensor y1 = layer->forward(x1), y2 = dense->forward(x2);
  y1.square().sum().backward();
  y2.square().sum().backward();
  const std::string prefix = name;
  expect_close((prefix + " output").c_str(), y1, y2);
  expect_close((prefix + " input gradient").c_str(), x1.grad(), x2.grad());
  expect_close((prefix + " weight gradient").c_str(), layer->weight.grad(), dense->weight.grad());
  expect_close((prefix + " bias gradient").c_str(), layer->bias.grad(), dense->bias.grad());
}

/// Bytes a layer's forward leaves allocated (its saved tensors and the output), the input freed.
template <class Layer>
std::int64_t held_after_forward(Layer& layer, const torch::Device& device) {
  dt::MemoryMeter meter(device);
  const std::int64_t before = meter.current();
  const torch::Tensor y = layer->forward(torch::relu(torch::randn({8192, 1024}, device)));
  return meter.current() - before;
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

  std::cout << "dropit::torch_cuda consumer: " << (failures ? "FAILED" : "layers equal torch's")
            << " on " << static_cast<int>(torch::cuda::device_count()) << " CUDA device(s)\n";
  return failures ? 1 : 0;
}
