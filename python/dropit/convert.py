"""``convert``: replaces the Linear and Conv2d layers (and ReLU) anywhere in a module tree by
dropit layers that share their parameters, and reports what it did."""

import re
from dataclasses import dataclass, field
from typing import Iterable, List, Optional, Union

import torch
from torch import nn

from . import _C, functional
from . import nn as dnn
from ._policy import Policy

__all__ = ["ConvertReport", "LayerReport", "convert"]

_LINEAR_TYPES = (nn.Linear, nn.modules.linear.NonDynamicallyQuantizableLinear)


@dataclass
class LayerReport:
    """One Linear, Conv2d or ReLU that ``convert`` looked at."""

    name: str
    kind: str
    reason: str = ""  # why it was left as it was; empty when converted
    input_shape: Optional[tuple] = None  # of the tensor cached, from ``example_input``
    cache_bytes: Optional[int] = None  # exact bytes of the cache dropit will save of it
    dense_bytes: Optional[int] = None  # bytes of that tensor, which the dense layer saves


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
            lines.append(f"  + {layer.name} ({layer.kind}){size}")
        for layer in self.skipped:
            lines.append(f"  - {layer.name} ({layer.kind}): {layer.reason}")
        return "\n".join(lines)


class _Converter:
    def __init__(self, policy: Policy, relu: bool, skip_first: bool, exclude: List[str]):
        self.policy, self.relu, self.skip_first = policy, relu, skip_first
        self.exclude = [re.compile(pattern) for pattern in exclude]
        self.report = ConvertReport()
        self.seen_first = False
        self.layers = 0
        # id(module) -> what stands at its place now (a replacement, or itself when it was left), so
        # that a module held in several places gets one decision.
        self.decided = {}
        self.visited = set()

    def visit(self, parent: nn.Module, prefix: str):
        if id(parent) in self.visited:
            return
        self.visited.add(id(parent))
        for name, child in list(parent._modules.items()):
            if child is None:
                continue
            qualified = f"{prefix}.{name}" if prefix else name
            if id(child) in self.decided:
                parent._modules[name] = self.decided[id(child)]
                continue
            replacement = self.replacement_for(parent, child, qualified)
            self.decided[id(child)] = replacement if replacement is not None else child
            if replacement is None:
                self.visit(child, qualified)
            else:
                parent._modules[name] = replacement

    def skip(self, name: str, kind: str, reason: str):
        self.report.skipped.append(LayerReport(name, kind, reason))
        return None

    def replacement_for(self, parent: nn.Module, child: nn.Module, name: str):
        kind = type(child).__name__
        if isinstance(child, (dnn.Linear, dnn.Conv2d, dnn.ReLU)):
            return self.skip(name, kind, "already a dropit layer")
        is_linear = isinstance(child, nn.Linear)
        is_conv = isinstance(child, nn.Conv2d)
        if is_linear or is_conv:
            first = not self.seen_first
            self.seen_first = True
            if self.skip_first and first:
                return self.skip(name, kind, "first layer (skip_first): its input is the batch, "
                                 "which stays alive anyway")
            if is_linear and type(child) not in _LINEAR_TYPES or \
                    is_conv and type(child) is not nn.Conv2d:
                return self.skip(name, kind, f"a subclass of nn.{'Linear' if is_linear else 'Conv2d'}"
                                 " with behaviour of its own")
            if isinstance(parent, nn.MultiheadAttention):
                return self.skip(name, kind, "nn.MultiheadAttention uses this weight directly "
                                 "and never calls the layer")
            if child.weight.dtype not in functional.SUPPORTED_DTYPES:
                return self.skip(name, kind, f"parameters of dtype {child.weight.dtype}; dropit "
                                 "supports float32, float16 and bfloat16")
        elif not (self.relu and type(child) is nn.ReLU):
            return None
        if any(pattern.search(name) for pattern in self.exclude):
            return self.skip(name, kind, "matches an exclude pattern")
        self.report.converted.append(LayerReport(name, kind))
        if type(child) is nn.ReLU:
            return dnn.ReLU.from_dense(child)
        # Each layer draws its own random positions.
        seed = (self.policy.seed + self.layers * 0x9E3779B97F4A7C15) % 2**64
        self.layers += 1
        fields = {**self.policy.__dict__, "seed": seed}
        return (dnn.Linear if is_linear else dnn.Conv2d).from_dense(child, **fields)


def _measure_inputs(model: nn.Module, example_input, report: ConvertReport):
    """Records each converted layer's input shape in a dense eval forward and plans its cache."""
    modules = dict(model.named_modules(remove_duplicate=False))
    hooks = []
    for layer in report.converted:
        module = modules.get(layer.name)
        if not isinstance(module, (dnn.Linear, dnn.Conv2d)):
            continue

        def record(module, args, layer=layer):
            x = args[0]
            if isinstance(module, dnn.Conv2d):
                x = module._padded(x if x.dim() == 4 else x.unsqueeze(0))[0]  # what it caches
            if layer.input_shape is None:
                layer.input_shape = tuple(x.shape)
                layer.cache_bytes = module.dropit_policy.plan(x.shape, x.dtype,
                                                              module._channel_axis)["bytes"]
                layer.dense_bytes = x.numel() * x.element_size()

        hooks.append(module.register_forward_pre_hook(record))
    was_training = model.training
    try:
        model.eval()
        with torch.no_grad():
            if isinstance(example_input, (tuple, list)):
                model(*example_input)
            else:
                model(example_input)
    finally:
        model.train(was_training)
        for hook in hooks:
            hook.remove()


def convert(model: nn.Module, gamma: float = 0.9, policy: str = "chunked_min_k",
            granularity: str = "element", chunk_size: int = 16384, relu: bool = True,
            skip_first: bool = True, exclude: Union[str, Iterable[str]] = (), seed: int = 0,
            rescale: bool = False, example_input=None) -> ConvertReport:
    """Replaces, in place, every nn.Linear and nn.Conv2d of ``model`` (held as attributes or in
    Sequential, ModuleList or ModuleDict, at any depth) by a dropit layer that shares its
    parameters, and every nn.ReLU by the 1-bit-mask ReLU when ``relu``. State dicts are unchanged.

    skip_first: leave the first Linear/Conv2d (in registration order) dense.
    exclude: regular expressions searched in qualified names ("layer4", r"^head\\.").
    example_input: when given, one dense eval forward records each converted layer's input, and the
        report gives the exact cache bytes dropit will save for it next to the dense bytes.
    Returns a :class:`ConvertReport` of what was converted and what was left, with reasons.
    """
    chosen = Policy(gamma, policy, granularity, chunk_size, seed, rescale)
    patterns = [exclude] if isinstance(exclude, str) else list(exclude)
    converter = _Converter(chosen, relu, skip_first, patterns)
    converter.visit(model, "")
    if example_input is not None:
        _measure_inputs(model, example_input, converter.report)
    return converter.report
