"""What a linear layer's input may already be, so that the layer needs no cache of it.

- The output of torch's fused attention (a view with the heads merged, as an output projection reads
  it): the attention keeps it for its own backward, so saving it costs nothing.
- The output of a cheap producer (dropit.nn.LayerNorm, GELU, SiLU) whose inputs autograd keeps
  anyway: the layer saves nothing and recomputes its input in backward, exactly (the same kernel on
  the same tensors), and its weight gradient is the dense one.

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


def reusable(input: torch.Tensor) -> bool:
    """Whether a linear layer reading ``input`` needs no cache of it."""
    return kept_by_attention(input) or recipe_of(input) is not None


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
