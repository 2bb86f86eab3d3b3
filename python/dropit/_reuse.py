"""What a layer's input may already be, so that the layer needs no cache of it.

- The output of torch's fused attention (a view with the heads merged, as an output projection reads
  it): the attention keeps it for its own backward, so saving it costs nothing (linear layers).
- The output of a cheap producer (dropit.nn.LayerNorm, BatchNorm2d, GELU, SiLU, and a dropit ReLU
  applied to one) whose inputs autograd keeps anyway: the linear or convolution layer saves nothing
  and recomputes its input in backward, exactly (the same kernels on the same tensors; after
  BatchNorm in training, one affine pass from the statistics it saved, within rounding), and its
  weight gradient is the dense one. Linear layers and 2-D convolutions do so in C++ (the LibTorch
  adapters' functions, include/dropit/torch/recompute.hpp); recomputation through layers and
  convolutions of other dimensions through Python autograd functions.
- With ``recompute_layers``, the output of such a layer (its forward again on the recomputed
  input), which a producer then keeps none of (BatchNorm after a convolution after BatchNorm ->
  ReLU, GELU after a linear layer after LayerNorm): one more forward of the layer in backward.

Both are read off eager tensors. Under torch.compile a producer's output is marked as left to the
compiler instead: a layer reading it (directly or through a dropit ReLU) runs torch's own
operation, whose input the compiler computes again in backward from the producer's, fused with
what reads it there. LayerNorm, GELU and SiLU run inside an activation checkpoint, which the
compiler's partitioner always recomputes: left to its memory budget, it would keep their outputs
(at budget 1.0 it keeps what eager torch keeps). BatchNorm's output (and its ReLU's) is left to
the budget: its forward updates the running statistics, which a region recomputed in backward
must not do twice. The layers cache only what no producer gives again. Caching a producer's output
instead would cost a compress in forward and split the fusions (BatchNorm with ReLU) the compiler
makes of dense code.
"""

import functools
from typing import Callable, Optional, Tuple

import torch
import torch.nn.functional as F
import torch.utils.checkpoint

from . import _C

# The autograd nodes of torch's fused attention kernels: each keeps the attention's output for its
# own backward.
_FUSED_ATTENTION_NODES = frozenset((
    "ScaledDotProductFlashAttentionForCpuBackward0", "ScaledDotProductFlashAttentionBackward0",
    "ScaledDotProductEfficientAttentionBackward0", "ScaledDotProductCudnnAttentionBackward0"))

# The attribute a producer's output carries: (its version when produced, the sources' versions,
# recompute, sources, whether recompute runs a layer's forward, what the C++ recomputation takes
# or None, whether a dropit ReLU ran on the producer's output).
_RECIPE = "_dropit_recompute"
# The attribute a producer's output carries under torch.compile (dynamo traces it as a side effect
# of the graph's own tensors): True.
_LEFT_TO_COMPILER = "_dropit_left_to_compiler"


def kept_by_attention(input: torch.Tensor) -> bool:
    """Whether ``input`` is a view of a fused attention's output."""
    base = input._base
    if base is None:
        return False
    node = base.grad_fn
    return node is not None and node.name() in _FUSED_ATTENTION_NODES


def mark_recomputable(output: torch.Tensor, recompute: Callable, *sources: torch.Tensor,
                      runs_layer: bool = False, native: Optional[tuple] = None,
                      relu: bool = False):
    """Marks ``output`` as ``recompute(*sources)``: the sources are tensors autograd keeps anyway
    (the producer's input, parameters); ``runs_layer``: recompute runs a layer's forward again.
    ``native``: the same recomputation as the LibTorch adapters' C++ one takes it (the fields of
    ``_C.ProducerArguments`` but the last: kind, sources, normalized_shape, eps, approximate), so
    that a linear layer or 2-D convolution reading ``output`` recomputes it in C++; ``relu``: a
    dropit ReLU ran on the producer's output."""
    if not torch.is_grad_enabled():
        return output
    if torch.compiler.is_compiling():
        return leave_to_compiler(output)
    versions = tuple(source._version for source in sources)
    setattr(output, _RECIPE,
            (output._version, versions, recompute, sources, runs_layer, native, relu))
    return output


def leave_to_compiler(output: torch.Tensor) -> torch.Tensor:
    """Marks ``output``, traced by torch.compile, as one the compiler's partitioner recomputes
    cheaply (see the module's note)."""
    setattr(output, _LEFT_TO_COMPILER, True)
    return output


def produce_for_compiler(produce: Callable, input: torch.Tensor) -> torch.Tensor:
    """``produce(input)`` traced by torch.compile in an activation checkpoint, so that the
    partitioner recomputes the output in backward from ``input`` (which the producer's own backward
    keeps anyway) instead of keeping it, as eager dropit recomputes it; marked as left to the
    compiler."""
    if not torch.is_grad_enabled():
        return produce(input)
    output = torch.utils.checkpoint.checkpoint(produce, input, use_reentrant=False)
    # Marked as a view made here: inside a user's own checkpoint region dynamo refuses to mark the
    # nested checkpoint's output, a tensor of another region.
    return leave_to_compiler(output.view_as(output))


def left_to_compiler(input: torch.Tensor) -> bool:
    """Whether ``input`` is a traced output ``leave_to_compiler`` marked: a layer reading it runs
    torch's own operation. (The attribute first: eager tensors never carry it, and reading it costs
    less than asking whether dynamo is tracing.)"""
    return getattr(input, _LEFT_TO_COMPILER, False) and torch.compiler.is_compiling()


def carries_recipe(input: torch.Tensor) -> bool:
    """Whether ``input`` was marked at all: the cheap first test of a layer's every call. (Read
    with getattr: a tensor's ``__dict__`` is made on first access, an allocation on every fresh
    activation.)"""
    return getattr(input, _RECIPE, None) is not None


def marked(input: torch.Tensor) -> Optional[Tuple[Callable, tuple, bool]]:
    """(recompute, sources, runs_layer) of an untouched marked output, else None (also under
    autocast, where the layer computes in another dtype than the producer's output)."""
    recipe = getattr(input, _RECIPE, None)
    if recipe is None:
        return None
    version, source_versions, recompute, sources, runs_layer = recipe[:5]
    if version != input._version or _autocast_enabled(input):
        return None  # modified in place since, or computed in another dtype
    for source, source_version in zip(sources, source_versions):
        if source._version != source_version:
            return None
    return recompute, sources, runs_layer


def _autocast_enabled(tensor: torch.Tensor) -> bool:
    """Whether autocast is on for ``tensor``'s device; the test without arguments first, which
    every call of a layer reading a marked output makes."""
    return torch._C._is_any_autocast_enabled() and torch.is_autocast_enabled(tensor.device.type)


def native_of_marked(input: torch.Tensor) -> Tuple[Optional[tuple], bool]:
    """(its C++ recomputation's arguments or None, whether a ReLU ran) of an output ``marked``
    accepts."""
    return getattr(input, _RECIPE)[5:]


def _native_layer(input, weight, bias, convolution) -> Optional[torch.Tensor]:
    """The layer in C++ on an input marked with its native recomputation, else None."""
    if marked(input) is None:
        return None
    native, relu = native_of_marked(input)
    if native is None:
        return None
    return _C.layer_after_producer(input, weight, bias, convolution,
                                   _C.ProducerArguments(*native, relu))


def recipe_of(input: torch.Tensor,
              through_layers: bool = False) -> Optional[Tuple[Callable, tuple]]:
    """(recompute, sources) of an untouched producer output, else None; a recipe that runs a
    layer's forward again counts only ``through_layers``."""
    found = marked(input)
    if found is None or (found[2] and not through_layers):
        return None
    return found[0], found[1]


def _present(*tensors) -> tuple:
    return tuple(t for t in tensors if t is not None)


# A chain recomputing a layer's or producer's input on the way leaves it in a memo (a dict) shared
# with that layer's or producer's own backward, which takes it instead of computing it again; it
# lives from the chain's backward to the owner's, the next few nodes.
def _remembered(recompute: Callable, memo: dict, *sources) -> torch.Tensor:
    memo["value"] = value = recompute(*sources)
    return value


def _taken(recompute: Callable, memo: dict, *sources) -> torch.Tensor:
    value = memo.pop("value", None)
    return value if value is not None else recompute(*sources)


def _linear_after(has_bias: bool, recompute: Callable, weight, *rest) -> torch.Tensor:
    bias, inner = (rest[0], rest[1:]) if has_bias else (None, rest)
    return F.linear(recompute(*inner), weight, bias)


def _convolution_after(arguments: tuple, has_bias: bool, recompute: Callable, weight,
                       *rest) -> torch.Tensor:
    bias, inner = (rest[0], rest[1:]) if has_bias else (None, rest)
    stride, padding, dilation, groups = arguments
    return torch.convolution(recompute(*inner), weight, bias, stride, padding, dilation, False,
                             [0] * len(stride), groups)


def _layer_on_recomputed_input(input: torch.Tensor, through_layers: bool, apply: Callable,
                               after: Callable, weight: torch.Tensor,
                               bias: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """A linear or convolution layer's forward on a recomputed ``input``: ``apply(recompute,
    sources)`` runs its function; None where the input is no recomputable output (one recomputed
    through a layer counts only ``through_layers``). With ``through_layers``, on an input
    recomputed from producers only (a chain runs one layer at most), the output is marked as
    ``after(recompute, weight, bias, *sources)``, the function and that chain sharing a memo of the
    input."""
    found = marked(input)
    if found is None or (found[2] and not through_layers):
        return None
    recompute, sources, runs_layer = found
    if not through_layers or runs_layer:
        return apply(recompute, sources)
    memo = {}
    output = apply(functools.partial(_taken, recompute, memo), sources)
    return mark_recomputable(
        output, functools.partial(after, functools.partial(_remembered, recompute, memo)),
        weight, *_present(bias), *sources, runs_layer=True)


def recomputable(input: torch.Tensor, through_layers: bool = False) -> bool:
    """Whether ``input`` is a producer's untouched output, which a layer can recompute."""
    return recipe_of(input, through_layers) is not None


def reusable(input: torch.Tensor, through_layers: bool = False) -> bool:
    """Whether a linear layer reading ``input`` needs no cache of it."""
    return kept_by_attention(input) or recomputable(input, through_layers)


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


def linear_reusing_input(input: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                         through_layers: bool = False) -> Optional[torch.Tensor]:
    """``F.linear`` that needs no cache of ``input``, or None where the input is neither of the
    above and the layer caches it. ``through_layers``: an input recomputed through a layer counts,
    and the output of one recomputed from producers only is marked as recomputable too."""
    if torch.compiler.is_compiling():
        return None
    if kept_by_attention(input):
        return F.linear(input, weight, bias)
    if not carries_recipe(input):
        return None
    if not through_layers:
        output = _native_layer(input, weight, bias, None)
        if output is not None:
            return output
    return _layer_on_recomputed_input(
        input, through_layers,
        lambda recompute, sources: RecomputedInputLinear.apply(input, weight, bias, recompute,
                                                               *sources),
        functools.partial(_linear_after, bias is not None), weight, bias)


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
        # torch.convolution, not torch.ops.aten.convolution: a direct binding, without the
        # operator lookup of each call (half the host time on tiny tensors).
        return torch.convolution(input, weight, bias, stride, padding, dilation, False,
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
        grad_input, grad_weight, grad_bias = torch.ops.aten.convolution_backward.default(
            grad_output, input, weight, [weight.shape[0]] if ctx.has_bias else None, stride,
            padding, dilation, False, [0] * len(stride), groups, wanted)
        return (grad_input, grad_weight, grad_bias) + (None,) * (5 + len(sources))


def convolution_recomputing_input(input: torch.Tensor, weight: torch.Tensor,
                                  bias: Optional[torch.Tensor], stride, padding, dilation,
                                  groups: int,
                                  through_layers: bool = False) -> Optional[torch.Tensor]:
    """A zero-padded convolution that needs no cache of ``input``, or None where the input is no
    producer's untouched output and the layer caches it; ``through_layers`` as for linear."""
    if torch.compiler.is_compiling() or not carries_recipe(input):
        return None
    if not through_layers and len(stride) == 2:
        output = _native_layer(input, weight, bias, [*stride, *padding, *dilation, groups])
        if output is not None:
            return output
    arguments = (list(stride), list(padding), list(dilation), groups)
    return _layer_on_recomputed_input(
        input, through_layers,
        lambda recompute, sources: RecomputedInputConvolution.apply(
            input, weight, bias, *arguments, recompute, *sources),
        functools.partial(_convolution_after, arguments, bias is not None), weight, bias)


class RecomputedInputProducer(torch.autograd.Function):
    """A producer (LayerNorm, BatchNorm2d, GELU, SiLU) keeping none of its input, which
    ``recompute(*sources)`` gives again: forward is ``produce(input)``, the producer's own forward
    (running statistics included); backward recomputes the input and differentiates
    ``reproduce(input)``, the same output with nothing updated, with respect to the input and the
    producer's ``weight`` and ``bias`` (None where it has none)."""

    @staticmethod
    def forward(ctx, input, produce, reproduce, recompute, weight, bias, *sources):
        ctx.reproduce, ctx.recompute, ctx.parameters = reproduce, recompute, (weight, bias)
        ctx.save_for_backward(*sources)
        return produce(input)

    @staticmethod
    def backward(ctx, grad_output):
        with torch.no_grad():
            input = ctx.recompute(*ctx.saved_tensors)
        wants_input, wants_weight, wants_bias = ctx.needs_input_grad[0], *ctx.needs_input_grad[4:6]
        parameters = [p for p, wanted in zip(ctx.parameters, (wants_weight, wants_bias)) if wanted]
        with torch.enable_grad():
            input = input.detach().requires_grad_(wants_input)
            targets = [input] * wants_input + parameters
            grads = list(torch.autograd.grad(ctx.reproduce(input), targets, grad_output)
                         if targets else ())
        grad_input = grads.pop(0) if wants_input else None
        grad_weight = grads.pop(0) if wants_weight else None
        grad_bias = grads.pop(0) if wants_bias else None
        return ((grad_input, None, None, None, grad_weight, grad_bias)
                + (None,) * len(ctx.saved_tensors))


def _produced_after(reproduce: Callable, recompute: Callable, *sources) -> torch.Tensor:
    return reproduce(recompute(*sources))


def produce_recomputing_input(input: torch.Tensor, produce: Callable, reproduce: Callable,
                              weight: Optional[torch.Tensor],
                              bias: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """A producer's forward keeping none of ``input`` when a layer's forward can give it again
    (``recompute_layers``), its output marked as recomputable through that layer; else None."""
    if not torch.is_grad_enabled() or torch.compiler.is_compiling():
        return None
    found = marked(input)
    if found is None or not found[2]:
        return None
    recompute, sources, _ = found
    memo = {}
    output = RecomputedInputProducer.apply(input, produce, reproduce,
                                           functools.partial(_taken, recompute, memo), weight,
                                           bias, *sources)
    return mark_recomputable(
        output, functools.partial(_produced_after, reproduce,
                                  functools.partial(_remembered, recompute, memo)),
        *sources, runs_layer=True)
