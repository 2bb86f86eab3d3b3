// A program using dropit::torch from a project that embeds dropit and never called
// find_package(Torch): a dropit Linear's weight gradient at gamma 0 equals torch's.
#include <dropit/torch.hpp>
#include <iostream>

int main() {
  torch::manual_seed(0);
  dropit::torch::Linear layer(torch::nn::LinearOptions(8, 4),
                              dropit::torch::DropitOptions().gamma(0.0));
  torch::nn::Linear dense(torch::nn::LinearOptions(8, 4));
  {
    torch::NoGradGuard no_grad;
    dense->weight.copy_(layer->weight);
    dense->bias.copy_(layer->bias);
  }
  const torch::Tensor x = torch::randn({3, 8});
  layer->forward(x).square().sum().backward();
  dense->forward(x).square().sum().backward();
  const bool same = torch::allclose(layer->weight.grad(), dense->weight.grad(), 1e-5, 1e-6);
  std::cout << "dropit::torch consumer: weight gradient " << (same ? "equals" : "differs from")
            << " torch's\n";
  return same ? 0 : 1;
}
