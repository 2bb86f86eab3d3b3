"""``torch.ops.dropit.convolution``: a convolution of any dimension whose input is cached compactly
for the weight gradient, for the layers dropit has no sparse weight-gradient kernel for (Conv3d).

The forward is torch's own convolution and compresses its input with dropit's compress operator;
the backward densifies the cache (kept values in place, zeros elsewhere) and hands it to torch's own
convolution backward, so the weight gradient is what torch computes from the kept elements and the
input gradient is exact. A Python custom operator with its fake kernel and autograd: torch.compile
traces it whole.
"""

from typing import List, Optional, Tuple

import torch

from . import _C, _operators  # noqa: F401  (_operators: compress's and densify's fake kernels)

_ops = torch.ops.dropit


def _forward(input: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                stride: List[int], padding: List[int], dilation: List[int], groups: int,
                selection: str, granularity: str, channel_axis: int, gamma: float, chunk_size: int,
                seed: int, call: int, rescale: bool, call_key: Optional[torch.Tensor] = None
                ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(output, cache values, cache positions); the policy arguments as the other operators'."""
    output = torch.convolution(input, weight, bias, stride, padding, dilation, False,
                               [0] * len(stride), groups)
    values, positions = _ops.compress(input, selection, granularity, channel_axis, gamma,
                                      chunk_size, seed, call, rescale, call_key)
    return output, values, positions


convolution = torch.library.custom_op("dropit::convolution", _forward, mutates_args=())
# torch's and dropit's fake kernels give every shape: the forward is its own fake kernel.
convolution.register_fake(_forward)


def _setup_context(ctx, inputs, output):
    (input, weight, bias, stride, padding, dilation, groups, selection, granularity, channel_axis,
     gamma, chunk_size, seed, call, rescale, call_key) = inputs
    _, values, positions = output
    ctx.save_for_backward(values, positions, weight, call_key)
    policy = _C.PolicyArguments(selection, granularity, channel_axis, gamma, chunk_size, seed, call,
                                rescale)
    ctx.layout = _C.plan([int(size) for size in input.shape],
                         str(input.dtype).replace("torch.", ""), policy)["layout"]
    ctx.convolution = (stride, padding, dilation, groups)
    ctx.bias_sizes = None if bias is None else list(bias.shape)


def _backward(ctx, grad_output, _values_grad, _positions_grad):
    values, positions, weight, call_key = ctx.saved_tensors
    stride, padding, dilation, groups = ctx.convolution
    input = _ops.densify(values, positions, ctx.layout, call_key)
    wanted = [ctx.needs_input_grad[0], ctx.needs_input_grad[1],
              ctx.bias_sizes is not None and ctx.needs_input_grad[2]]
    grad_input, grad_weight, grad_bias = torch.ops.aten.convolution_backward(
        grad_output.contiguous(), input, weight, ctx.bias_sizes, stride, padding, dilation, False,
        [0] * len(stride), groups, wanted)
    return (grad_input, grad_weight, grad_bias) + (None,) * 13


convolution.register_autograd(_backward, setup_context=_setup_context)
