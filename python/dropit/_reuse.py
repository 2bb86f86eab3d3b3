"""What a layer's input may already be, so that the layer needs no cache of it.

- The output of torch's fused attention (a view with the heads merged, as an output projection reads
  it): the attention keeps it for its own backward, so saving it costs nothing (linear layers).
- The output of a cheap producer (dropit.nn.LayerNorm, BatchNorm2d, GELU, SiLU, and a dropit ReLU
  applied to one) whose inputs autograd keeps anyway: the linear or convolution layer saves nothing
  and recomputes its input in backward, exactly (the same kernels on the same tensors; after
  BatchNorm in training, one affine pass from the statistics it saved, within rounding), and its
  weight gradient is the dense one.

Both are read off eager tensors; torch.compile does not trace them (its partitioner recomputes
cheap producers itself), so a compiled layer caches.
"""

from typing import Callable, Optional, Tuple

import torch
import torch.nn.functional as F

# The autograd nodes of torch's fused attention kernels: each keeps the attention's output for its
# own backward.
_FUSED_ATTENTION_NODES = frozenset((
    "ScaledDotProductFlashAttentionForCpuBackward0", "ScaledDotProductFlashAttentionBackward0",
    "ScaledDotProductEfficientAttentionBackward0", "ScaledDotProductCudnnAttentionBackward0"))

# The attribute a producer's output carries: (its version when produced, recompute, sources).
_RECIPE = "_dropit_recompute"


def kept_by_attention(input: torch.Tensor) -> bool:
    """Whether ``input`` is a view of a fused attention's output."""
    base = input._base
    if base is None:
        return False
    node = base.grad_fn
    return node is not None and node.name() in _FUSED_ATTENTION_NODES


def mark_recomputable(output: torch.Tensor, recompute: Callable, *sources: torch.Tensor):
    """Marks ``output`` as ``recompute(*sources)``: the sources are tensors autograd keeps anyway
    (the producer's input, parameters)."""
    if torch.is_grad_enabled() and not torch.compiler.is_compiling():
        versions = tuple(source._version for source in sources)
        setattr(output, _RECIPE, (output._version, versions, recompute, sources))
    return output


def recipe_of(input: torch.Tensor) -> Optional[Tuple[Callable, tuple]]:
    """(recompute, sources) of an untouched producer output, else None (also under autocast, where
    the layer computes in another dtype than the producer's output)."""
    recipe = input.__dict__.get(_RECIPE)
    if recipe is None:
        return None
    version, source_versions, recompute, sources = recipe
    if version != input._version or torch.is_autocast_enabled(input.device.type) or any(
            source._version != v for source, v in zip(sources, source_versions)):
        return None  # modified in place since, or computed in another dtype
    return recompute, sources


def recomputable(input: torch.Tensor) -> bool:
    """Whether ``input`` is a producer's untouched output, which a layer can recompute."""
    return recipe_of(input) is not None


def reusable(input: torch.Tensor) -> bool:
    """Whether a linear layer reading ``input`` needs no cache of it."""
    return kept_by_attention(input) or recomputable(input)


class RecomputedInputLinear(torch.autograd.Function):
    """``F.linear(input, weight, bias)`` saving only ``sources``: backward recomputes the input as
    ``recompute(*sources)`` for the weight gradient."""

    @staticmethod
    def forward(ctx, input, weight, bias, recompute, *sources):
        ctx.recompute, ctx.has_bias = recompute, bias is not None
        ctx.save_for_backward(weight, *sources)
        return F.linear(input, weight, bias)

    @staticmethod
    def backward(ctx, grad_output):
        weight, *sources = ctx.saved_tensors
        grad_input = grad_weight = grad_bias = None
        if ctx.needs_input_grad[0]:
            grad_input = grad_output.matmul(weight)
        grad_rows = grad_output.reshape(-1, grad_output.shape[-1])
        if ctx.needs_input_grad[1]:
            with torch.no_grad():
                input = ctx.recompute(*sources)
            grad_weight = grad_rows.t().mm(input.reshape(-1, input.shape[-1]))
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_bias = grad_rows.sum(0)
        return (grad_input, grad_weight, grad_bias, None) + (None,) * len(sources)


def linear_reusing_input(input: torch.Tensor, weight: torch.Tensor,
                         bias: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """``F.linear`` that needs no cache of ``input``, or None where the input is neither of the
    above and the layer caches it."""
    if torch.compiler.is_compiling():
        return None
    if kept_by_attention(input):
        return F.linear(input, weight, bias)
    recipe = recipe_of(input)
    if recipe is None:
        return None
    recompute, sources = recipe
    return RecomputedInputLinear.apply(input, weight, bias, recompute, *sources)


class RecomputedInputConvolution(torch.autograd.Function):
    """A zero-padded convolution saving only ``sources``: backward recomputes the input as
    ``recompute(*sources)`` and runs torch's own convolution backward on it, as the dense layer's
    backward does."""

    @staticmethod
    def forward(ctx, input, weight, bias, stride, padding, dilation, groups, recompute, *sources):
        ctx.recompute, ctx.has_bias = recompute, bias is not None
        ctx.arguments = (stride, padding, dilation, groups)
        ctx.input_shape = input.shape
        ctx.save_for_backward(weight, *sources)
        return torch.ops.aten.convolution(input, weight, bias, stride, padding, dilation, False,
                                          [0] * len(stride), groups)

    @staticmethod
    def backward(ctx, grad_output):
        weight, *sources = ctx.saved_tensors
        stride, padding, dilation, groups = ctx.arguments
        wanted = [ctx.needs_input_grad[0], ctx.needs_input_grad[1],
                  ctx.has_bias and ctx.needs_input_grad[2]]
        if wanted[1]:
            with torch.no_grad():
                input = ctx.recompute(*sources)
        else:  # the input gradient reads only the input's shape
            input = grad_output.new_empty(ctx.input_shape)
        grad_input, grad_weight, grad_bias = torch.ops.aten.convolution_backward(
            grad_output, input, weight, [weight.shape[0]] if ctx.has_bias else None, stride,
            padding, dilation, False, [0] * len(stride), groups, wanted)
        return (grad_input, grad_weight, grad_bias) + (None,) * (5 + len(sources))


def convolution_recomputing_input(input: torch.Tensor, weight: torch.Tensor,
                                  bias: Optional[torch.Tensor], stride, padding, dilation,
                                  groups: int) -> Optional[torch.Tensor]:
    """A zero-padded convolution that needs no cache of ``input``, or None where the input is no
    producer's untouched output and the layer caches it."""
    if torch.compiler.is_compiling():
        return None
    recipe = recipe_of(input)
    if recipe is None:
        return None
    recompute, sources = recipe
    return RecomputedInputConvolution.apply(input, weight, bias, list(stride), list(padding),
                                            list(dilation), groups, recompute, *sources)
