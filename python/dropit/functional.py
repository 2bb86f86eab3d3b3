"""dropit's operations as functions on tensors.

``linear``, ``conv2d`` and ``relu`` are dropit's operators (``torch.ops.dropit.*``, registered with
torch's dispatcher, so torch.compile traces them whole): linear and conv2d save a compact cache of
their input for the weight gradient, relu saves a 1-bit mask instead of its output. Without
gradients (``torch.no_grad``, or a weight that needs none) they are torch's own dense operations.
Under autocast they run in the autocast dtype, their cache included. ``compress`` and ``densify``
expose the cache itself.
"""

from typing import Optional, Sequence, Union

import torch
import torch.nn.functional as F

from . import _C, _operators  # noqa: F401  (_operators: the operators' fake kernels)
from ._policy import Policy

__all__ = ["Cache", "compress", "conv2d", "densify", "linear", "relu"]

# The element types the library stores (float, half, bfloat16).
SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

_ops = torch.ops.dropit
# The operators' only overloads, called directly: a call skips overload resolution.
_linear, _conv2d, _relu = _ops.linear.default, _ops.conv2d.default, _ops.relu.default
# The same operators reached from C++ (python/src/layer_calls.hpp) with the policy converted once
# per layer: no argument parsing or boxing per call. Eager calls on plain tensors take them;
# torch.compile traces, and tensors that override __torch_function__ see, the operators above.
_DIRECT = {_linear: _C.linear, _conv2d: _C.conv2d}


def _direct(tensors, compiling: Optional[bool] = None) -> bool:
    """Whether a layer's call on ``tensors`` may take the direct entry of its operator
    (``compiling``: what torch.compiler.is_compiling() says, where the caller asked already)."""
    if compiling is None:
        compiling = torch.compiler.is_compiling()
    return not (compiling or torch.overrides.has_torch_function(tensors))


def _policy_of(dropit_policy: Optional[Policy], fields: dict) -> Policy:
    """``dropit_policy``, or a Policy made of ``fields`` (gamma=, policy=, ...)."""
    if dropit_policy is not None:
        if fields:
            raise TypeError(f"pass either dropit_policy= or the policy fields {sorted(fields)}, "
                            "not both")
        return dropit_policy
    return Policy(**fields)


def _caches(weight: torch.Tensor) -> bool:
    return torch.is_grad_enabled() and weight.requires_grad


def linear(input: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None,
           dropit_policy: Optional[Policy] = None, *, call: int = 0,
           **policy_fields) -> torch.Tensor:
    """``torch.nn.functional.linear`` whose weight gradient comes from a compact cache of
    ``input``. The policy is ``dropit_policy``, or a :class:`Policy` made of ``policy_fields``
    (gamma=0.9, policy="chunked_min_k", ...). Random selection draws its positions from
    (seed, ``call``): pass a new ``call`` each step (dropit.nn layers count their calls)."""
    chosen = _policy_of(dropit_policy, policy_fields)
    if not _caches(weight):
        return F.linear(input, weight, bias)
    return _linear(input, weight, bias, *chosen.arguments(channel_axis=-1, call=call))


def _pair(value, name) -> tuple:
    if isinstance(value, int):
        return (value, value)
    value = tuple(value)
    if len(value) != 2:
        raise ValueError(f"conv2d {name} = {value} must be an int or a pair")
    return value


def conv2d(input: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None,
           stride: Union[int, Sequence[int]] = 1, padding: Union[int, Sequence[int]] = 0,
           dilation: Union[int, Sequence[int]] = 1, groups: int = 1,
           dropit_policy: Optional[Policy] = None, *, call: int = 0,
           **policy_fields) -> torch.Tensor:
    """``torch.nn.functional.conv2d`` (zero padding given as numbers) whose weight gradient
    comes from a compact cache of ``input``; ``call`` as in :func:`linear`."""
    chosen = _policy_of(dropit_policy, policy_fields)
    if isinstance(padding, str):
        raise ValueError(f"dropit.functional.conv2d takes numeric padding, not '{padding}'; "
                         "dropit.nn.Conv2d accepts 'same' and 'valid'")
    stride, padding, dilation = _pair(stride, "stride"), _pair(padding, "padding"), _pair(
        dilation, "dilation")
    if not _caches(weight):
        return F.conv2d(input, weight, bias, stride, padding, dilation, groups)
    return _conv2d(input, weight, bias, stride, padding, dilation, int(groups),
                       *chosen.arguments(channel_axis=1, call=call))


def relu(input: torch.Tensor) -> torch.Tensor:
    """ReLU that saves a 1-bit mask for backward instead of its output. Inputs the library does
    not take (other dtypes; devices other than the CPU, and CUDA in a build with CUDA) get torch's
    own ReLU."""
    if not (torch.is_grad_enabled() and input.requires_grad):
        return F.relu(input)
    # The operator itself gives other dtypes and devices torch's ReLU.
    return _C.relu(input) if _direct((input,)) else _relu(input)


class Cache:
    """A compact cache: the kept values, their encoded positions, and the layout that reads them."""

    def __init__(self, values: torch.Tensor, positions: torch.Tensor, layout: Sequence[int]):
        self.values, self.positions, self.layout = values, positions, list(layout)
        info = _C.describe(self.layout)
        self.shape = torch.Size(info["shape"])
        self.encoding = info["encoding"]
        self.kept = info["kept"]

    @property
    def nbytes(self) -> int:
        """Bytes held by the cache's tensors."""
        return sum(t.numel() * t.element_size() for t in (self.values, self.positions))

    def __repr__(self):
        return (f"dropit.functional.Cache(shape={tuple(self.shape)}, dtype={self.values.dtype}, "
                f"kept={self.kept}, encoding={self.encoding}, nbytes={self.nbytes})")


def compress(input: torch.Tensor, dropit_policy: Optional[Policy] = None, *, channel_axis: int = 1,
             call: int = 0, **policy_fields) -> Cache:
    """The cache a dropit layer would save of ``input`` (``channel_axis`` matters for channel
    granularity: 1 for NCHW activations, -1 for a linear layer's input)."""
    policy = _policy_of(dropit_policy, policy_fields)
    values, positions = _ops.compress(input, *policy.arguments(channel_axis, call))
    layout = policy.plan(input.shape, input.dtype, channel_axis, call)["layout"]
    return Cache(values, positions, layout)


def densify(cache: Cache) -> torch.Tensor:
    """The dense tensor ``cache`` stands for: kept values in place, zeros elsewhere."""
    return _ops.densify(cache.values, cache.positions, cache.layout)
