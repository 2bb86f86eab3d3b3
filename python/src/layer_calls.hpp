#pragma once
// The layers' operators (dropit::linear, conv2d, relu) called from Python by the eager layers: the
// same operators, reached through the dispatcher from C++ with the policy already converted, so a
// call skips torch.ops' argument parsing and boxing (on small tensors a third of a layer's host
// cost). torch.compile and tensors overriding __torch_function__ get the operators themselves
// (python/dropit/functional.py decides).

#include <ATen/ATen.h>

#include <cstdint>
#include <optional>

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

}  // namespace dropit_python
