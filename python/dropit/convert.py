"""``convert``: replaces the linear, convolution and attention layers (and ReLU, the cheap producers
and Dropout) anywhere in a module tree by dropit layers that share their parameters, and reports
what it did."""

import functools
import re
from dataclasses import dataclass, field
from typing import Iterable, List, Optional, Union

import torch
from torch import nn

from . import _C, functional
from . import nn as dnn
from ._policy import Policy

__all__ = ["ConvertReport", "LayerReport", "convert"]


@dataclass
class LayerReport:
    """One layer that ``convert`` looked at."""

    name: str
    kind: str
    reason: str = ""  # why it was left as it was; empty when converted
    input_shape: Optional[tuple] = None  # of the (first) tensor cached, from ``example_input``
    cache_bytes: Optional[int] = None  # exact bytes of the caches dropit will save
    dense_bytes: Optional[int] = None  # bytes of the tensors cached, which the dense layer saves
    # An input it needs no cache of: recomputed from its producer, or kept by the attention.
    reuses_input: bool = False


@dataclass
class ConvertReport:
    converted: List[LayerReport] = field(default_factory=list)
    skipped: List[LayerReport] = field(default_factory=list)

    def __str__(self) -> str:
        lines = [f"converted {len(self.converted)} layer(s), left {len(self.skipped)}"]
        for layer in self.converted:
            size = ""
            if layer.cache_bytes is not None:
                size = (f"  input {list(layer.input_shape)}: cache {layer.cache_bytes} B "
                        f"vs dense {layer.dense_bytes} B "
                        f"({layer.cache_bytes / max(layer.dense_bytes, 1):.3f}x)")
                if layer.reuses_input:
                    size += " (input recomputed from its producer or kept by the attention)"
            lines.append(f"  + {layer.name} ({layer.kind}){size}")
        for layer in self.skipped:
            lines.append(f"  - {layer.name} ({layer.kind}): {layer.reason}")
        return "\n".join(lines)


def _is_transposed_linear(module: nn.Module) -> bool:
    """Hugging Face's Conv1D (transformers.pytorch_utils), recognised without importing it: a
    linear layer whose weight is [nx, nf]."""
    weight, nf = getattr(module, "weight", None), getattr(module, "nf", None)
    return (type(module).__name__ == "Conv1D" and isinstance(nf, int)
            and isinstance(weight, torch.Tensor) and weight.dim() == 2 and weight.shape[1] == nf)


# torch's layers dropit replaces, by exact type (a subclass may behave differently).
_REPLACEMENTS = {nn.Linear: dnn.Linear,
                 nn.modules.linear.NonDynamicallyQuantizableLinear: dnn.Linear,
                 nn.Conv1d: dnn.Conv1d, nn.Conv2d: dnn.Conv2d, nn.Conv3d: dnn.Conv3d,
                 nn.MultiheadAttention: dnn.MultiheadAttention}
_REPLACED_BASES = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.MultiheadAttention)
# Producers whose output a dropit linear layer recomputes instead of caching (recompute=True).
_PRODUCERS = {nn.LayerNorm: dnn.LayerNorm, nn.BatchNorm2d: dnn.BatchNorm2d, nn.GELU: dnn.GELU,
              nn.SiLU: dnn.SiLU}
# Weight-bearing layers dropit leaves, and why.
_LEFT = ((nn.modules.conv._ConvTransposeNd, "a transposed convolution: dropit has none"),
         (nn.Bilinear, "a bilinear layer: dropit has none"))


class _Converter:
    def __init__(self, policy: Policy, relu: bool, recompute: bool, exclude: List[str]):
        self.policy, self.relu, self.recompute = policy, relu, recompute
        self.exclude = [re.compile(pattern) for pattern in exclude]
        self.report = ConvertReport()
        self.layers = 0
        # id(module) -> what stands at its place now (a replacement, or itself when it was left), so
        # that a module held in several places gets one decision.
        self.decided = {}
        self.visited = set()
        # name of each replaced layer -> (the dense module, its replacement, [(parent, attribute)]).
        self.places = {}

    def visit(self, parent: nn.Module, prefix: str):
        if id(parent) in self.visited:
            return
        self.visited.add(id(parent))
        for name, child in list(parent._modules.items()):
            if child is None:
                continue
            qualified = f"{prefix}.{name}" if prefix else name
            if id(child) in self.decided:
                replacement = self.decided[id(child)]
                parent._modules[name] = replacement
                for dense, placed, places in self.places.values():
                    if dense is child:
                        places.append((parent, name))
                continue
            replacement = self.replacement_for(parent, child, qualified)
            self.decided[id(child)] = replacement if replacement is not None else child
            if replacement is None:
                self.visit(child, qualified)
            else:
                parent._modules[name] = replacement
                self.places[qualified] = (child, replacement, [(parent, name)])

    def skip(self, name: str, kind: str, reason: str):
        self.report.skipped.append(LayerReport(name, kind, reason))
        return None

    def replacement_for(self, parent: nn.Module, child: nn.Module, name: str):
        kind = type(child).__name__
        if isinstance(child, (dnn._CachingLayer, dnn._Producer, dnn.ReLU, dnn.Dropout)):
            return self.skip(name, kind, "already a dropit layer")
        for left, reason in _LEFT:
            if isinstance(child, left):
                return self.skip(name, kind, reason)
        layer = _REPLACEMENTS.get(type(child))
        if layer is None and _is_transposed_linear(child):
            layer = dnn.TransposedLinear
        if layer is None and isinstance(child, _REPLACED_BASES):
            base = next(base for base in _REPLACED_BASES if isinstance(child, base))
            return self.skip(name, kind, f"a subclass of nn.{base.__name__} with behaviour of its "
                             "own")
        if layer is not None:
            if isinstance(parent, nn.MultiheadAttention):
                return self.skip(name, kind, "nn.MultiheadAttention uses this weight directly "
                                 "and never calls the layer")
            if layer is dnn.MultiheadAttention and (child.bias_k is not None or
                                                    child.add_zero_attn):
                return self.skip(name, kind, "add_bias_kv or add_zero_attn: dropit's "
                                 "MultiheadAttention has neither")
            dtype = next(child.parameters()).dtype
            if dtype not in functional.SUPPORTED_DTYPES:
                return self.skip(name, kind, f"parameters of dtype {dtype}; dropit supports "
                                 "float32, float16 and bfloat16")
        elif self.relu and type(child) is nn.ReLU:
            layer = dnn.ReLU
        elif self.recompute and type(child) in _PRODUCERS and not getattr(child, "inplace", False):
            layer = _PRODUCERS[type(child)]
        elif self.recompute and type(child) is nn.Dropout:
            layer = dnn.Dropout
        else:
            return None
        if any(pattern.search(name) for pattern in self.exclude):
            return self.skip(name, kind, "matches an exclude pattern")
        self.report.converted.append(LayerReport(name, kind))
        if not issubclass(layer, dnn._CachingLayer):
            return layer.from_dense(child)
        # Each layer draws its own random positions.
        seed = (self.policy.seed + self.layers * 0x9E3779B97F4A7C15) % 2**64
        self.layers += 1
        return layer.from_dense(child, **{**self.policy.__dict__, "seed": seed})

    def caching_layers(self) -> dict:
        """name -> each converted layer that caches its input."""
        return {name: replacement for name, (_, replacement, _) in self.places.items()
                if isinstance(replacement, dnn._CachingLayer)}

    def entry(self, name: str) -> LayerReport:
        return next(layer for layer in self.report.converted if layer.name == name)

    def move_to_skipped(self, name: str, reason: str):
        entry = self.entry(name)
        self.report.converted.remove(entry)
        self.skip(name, entry.kind, reason)

    def restore(self, name: str, reason: str):
        """Puts back, everywhere it stood, the dense layer that ``name`` replaced."""
        dense, _, places = self.places.pop(name)
        for parent, attribute in places:
            parent._modules[attribute] = dense
        self.decided[id(dense)] = dense
        self.move_to_skipped(name, reason)


_FED_BY_MODEL_INPUT = ("skip_first: its input is the model's own input, which stays alive "
                       "anyway")


def _tensors(args, kwargs) -> list:
    return [value for value in (*args, *kwargs.values()) if isinstance(value, torch.Tensor)]


def _arguments(example_input) -> tuple:
    """(args, kwargs) of a call on ``example_input``: a tensor, a tuple or list of arguments, or a
    dict of keyword arguments."""
    if isinstance(example_input, dict):
        return (), example_input
    if isinstance(example_input, (tuple, list)):
        return tuple(example_input), {}
    return (example_input,), {}


def _fed_by(inputs: list, args, kwargs) -> bool:
    return any(t is x for t in _tensors(args, kwargs) for x in inputs)


def _measure(model: nn.Module, example_input, converter: _Converter, skip_first: bool):
    """One dense eval forward on ``example_input``: records what each converted layer caches and
    plans its cache; with ``skip_first``, puts back the dense layers fed by the model's input."""
    args, kwargs = _arguments(example_input)
    inputs = _tensors(args, kwargs)
    fed_by_input, hooks = [], []
    for name, module in converter.caching_layers().items():

        def record(module, args, kwargs, layer=converter.entry(name)):
            if _fed_by(inputs, args, kwargs):
                fed_by_input.append(layer.name)
            if layer.input_shape is None:
                read = module._weight_gradient_inputs(*args, **kwargs)
                cached = [x for x, is_cached in read if is_cached]
                layer.input_shape = tuple(read[0][0].shape)
                layer.cache_bytes = sum(
                    module.dropit_policy.plan(x.shape, x.dtype, module._channel_axis)["bytes"]
                    for x in cached)
                layer.dense_bytes = sum(x.numel() * x.element_size() for x, _ in read)
                layer.reuses_input = len(cached) < len(read)

        hooks.append(module.register_forward_pre_hook(record, with_kwargs=True))
    # Each module's own mode back afterwards: a model in training may hold frozen (eval) parts.
    modes = [(module, module.training) for module in model.modules()]
    try:
        model.eval()
        # With gradients: the autograd graph says which inputs need no cache (_reuse).
        with torch.enable_grad():
            model(*args, **kwargs)
    finally:
        for module, training in modes:
            module.training = training
        for hook in hooks:
            hook.remove()
    if skip_first:
        for name in dict.fromkeys(fed_by_input):
            converter.restore(name, _FED_BY_MODEL_INPUT)


class _FirstForwardProbe:
    """skip_first without an example input, decided during the model's first eager forward (not
    while torch.compile traces it): meanwhile each converted layer checks whether its input is one
    of the model's, and if so runs dense from then on. The layer stays where it is (the model may
    have been wrapped or sharded since convert); the report lists it as left."""

    def __init__(self, model: nn.Module, converter: _Converter):
        self.converter, self.inputs, self.probing = converter, [], []
        self.hooks = [model.register_forward_pre_hook(self.before, with_kwargs=True),
                      model.register_forward_hook(self.after, with_kwargs=True)]

    def before(self, model, args, kwargs):
        if torch.compiler.is_compiling():
            return
        self.disarm()  # a forward that raised left its probes
        self.inputs = _tensors(args, kwargs)
        for name, layer in self.converter.caching_layers().items():
            layer.forward = functools.partial(self.forward, name, layer)
            self.probing.append(layer)

    def forward(self, name: str, layer: nn.Module, *args, **kwargs):
        if not layer._runs_dense and _fed_by(self.inputs, args, kwargs):
            layer._runs_dense = True
            self.converter.move_to_skipped(name, _FED_BY_MODEL_INPUT)
        return type(layer).forward(layer, *args, **kwargs)

    def disarm(self):
        for layer in self.probing:
            del layer.forward
        self.probing, self.inputs = [], []

    def after(self, model, args, kwargs, output):
        if self.probing:
            self.disarm()
            for hook in self.hooks:
                hook.remove()


def convert(model: nn.Module, gamma: float = 0.9, policy: str = "chunked_min_k",
            granularity: str = "element", chunk_size: int = 16384, relu: bool = True,
            skip_first: bool = True, exclude: Union[str, Iterable[str]] = (), seed: int = 0,
            rescale: bool = False, example_input=None, recompute: bool = True,
            recompute_layers: bool = False) -> ConvertReport:
    """Replaces, in place, every nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.MultiheadAttention
    and Hugging Face Conv1D of ``model`` (held as attributes or in Sequential, ModuleList or
    ModuleDict, at any depth) by a dropit layer that shares its parameters, and every nn.ReLU by
    the 1-bit-mask ReLU when ``relu``, and every nn.LayerNorm, nn.BatchNorm2d, nn.GELU and nn.SiLU
    by a producer whose output a dropit linear or convolution layer reading it (directly or through
    the 1-bit-mask ReLU) recomputes in backward instead of caching (exact: the producer keeps its
    input anyway) when ``recompute``, and then every nn.Dropout by one that returns its input
    itself where it drops nothing (so that a producer's output passes a dropout of 0 under
    torch.compile too). State dicts are unchanged.

    recompute_layers: recompute through a layer too: a linear or convolution layer whose input it
        recomputes marks its own output, and a producer reading that output keeps none of its input
        (BatchNorm after a convolution after BatchNorm -> ReLU, GELU after a linear layer after
        LayerNorm), running the layer's forward again in backward; gradients upstream of such a
        producer then agree with dense within rounding.

    skip_first: leave dense the layers whose input is the model's own input (the batch, which stays
        alive anyway). Decided in the forward on ``example_input`` when given (the dense layer is
        put back), otherwise during the model's first eager forward (the dropit layer stays and
        runs dense; a model compiled before it runs eagerly keeps every layer caching).
    exclude: regular expressions searched in qualified names ("layer4", r"^head\\.").
    example_input: a tensor, a tuple of arguments or a dict of keyword arguments. When given, one
        dense eval forward records each converted layer's input, and the report gives the exact
        cache bytes dropit will save for it next to the dense bytes.
    Returns a :class:`ConvertReport` of what was converted and what was left, with reasons.
    """
    chosen = Policy(gamma, policy, granularity, chunk_size, seed, rescale)
    patterns = [exclude] if isinstance(exclude, str) else list(exclude)
    converter = _Converter(chosen, relu, recompute, patterns)
    converter.visit(model, "")
    if recompute_layers:
        for _, replacement, _ in converter.places.values():
            if isinstance(replacement, (dnn._CachingLayer, dnn._Producer)):
                replacement._recompute_layers = True
    if example_input is not None:
        _measure(model, example_input, converter, skip_first)
    elif skip_first and converter.caching_layers():
        _FirstForwardProbe(model, converter)
    return converter.report
