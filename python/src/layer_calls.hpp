#pragma once
// The layers' operators (dropit::linear, conv2d, relu) called from Python by the eager layers: the
// same operators, reached through the dispatcher from C++ with the policy already converted, so a
// call skips torch.ops' argument parsing and boxing (on small tensors a third of a layer's host
// cost). torch.compile and tensors overriding __torch_function__ get the operators themselves
// (python/dropit/functional.py decides).

#include <ATen/ATen.h>

#include <cstdint>
#include <optional>
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

/// A zero-padded 2-D convolution whose input is BatchNorm's output (after a dropit ReLU where
/// `relu`), recomputed in backward from `batch_norm`: BatchNorm's input, weight, bias (either may
/// be undefined), and the batch's mean and inverse standard deviation its kernel saved. The
/// LibTorch adapters' function (include/dropit/torch/recompute.hpp): the Python layers' common
/// recomputation, without a Python autograd function or Python calls in backward.
at::Tensor call_conv2d_after_batch_norm(const at::Tensor& input, const at::Tensor& weight,
                                        const std::optional<at::Tensor>& bias,
                                        at::IntArrayRef stride, at::IntArrayRef padding,
                                        at::IntArrayRef dilation, std::int64_t groups,
                                        const std::vector<std::optional<at::Tensor>>& batch_norm,
                                        bool relu);

}  // namespace dropit_python
