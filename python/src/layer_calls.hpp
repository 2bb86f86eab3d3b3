#pragma once
// The layers' operators (dropit::linear, conv2d, relu) called from Python by the eager layers: the
// same operators, reached through the dispatcher from C++ with the policy already converted, so a
// call skips torch.ops' argument parsing and boxing (on small tensors a third of a layer's host
// cost). torch.compile and tensors overriding __torch_function__ get the operators themselves
// (python/dropit/functional.py decides).

#include <ATen/ATen.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "policy_arguments.hpp"

namespace dropit_python {

at::Tensor call_linear(const at::Tensor& input, const at::Tensor& weight,
                       const std::optional<at::Tensor>& bias, const operator_policy& policy,
                       const std::optional<at::Tensor>& call_key);
at::Tensor call_conv2d(const at::Tensor& input, const at::Tensor& weight,
                       const std::optional<at::Tensor>& bias, at::IntArrayRef stride,
                       at::IntArrayRef padding, at::IntArrayRef dilation, std::int64_t groups,
                       const operator_policy& policy, const std::optional<at::Tensor>& call_key);
at::Tensor call_relu(const at::Tensor& input);

/// What a producer's output is recomputed from in C++ (include/dropit/torch/recompute.hpp's
/// producer_recipe): `kind` "batch_norm" (sources: its input, weight, bias, and the batch's mean
/// and inverse standard deviation its kernel saved), "layer_norm" (input, weight, bias;
/// `normalized_shape`, `eps`), "gelu" (input; `approximate`) or "silu" (input); `relu`: a dropit
/// ReLU ran on the producer's output. Weight or bias may be None.
struct producer_arguments {
  std::string kind;
  std::vector<std::optional<at::Tensor>> sources;
  std::vector<std::int64_t> normalized_shape;
  double eps = 0.0;
  std::string approximate = "none";
  bool relu = false;
};

/// A linear layer, or where `convolution` is given (stride, padding, dilation, each of 2, and
/// groups) a zero-padded 2-D convolution, on a producer's output, recomputed in backward from
/// `producer`: the LibTorch adapters' functions, without a Python autograd function or Python
/// calls in backward.
at::Tensor call_layer_after_producer(const at::Tensor& input, const at::Tensor& weight,
                                     const std::optional<at::Tensor>& bias,
                                     const std::optional<std::vector<std::int64_t>>& convolution,
                                     const producer_arguments& producer);

/// BatchNorm's output again from the batch's mean and inverse standard deviation its kernel saved,
/// in one pass: the LibTorch adapters' recomputation (producer_recipe::normalise).
at::Tensor batch_norm_from_statistics(const at::Tensor& input,
                                      const std::optional<at::Tensor>& weight,
                                      const std::optional<at::Tensor>& bias, const at::Tensor& mean,
                                      const at::Tensor& invstd);

}  // namespace dropit_python
