"""Drop-in replacements for torch.nn.Linear, Conv2d and ReLU.

They are subclasses of torch's modules with the same parameters, buffers and state dicts. In
training mode with gradients enabled, Linear and Conv2d save a compact cache of their input (the
weight gradient is computed from it; the input gradient stays exact) and ReLU saves a 1-bit mask;
in eval mode or under ``torch.no_grad`` they run torch's own dense forward.
"""

import copy
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from . import functional
from ._policy import Policy

__all__ = ["Conv2d", "Linear", "ReLU"]


class _CachingLayer:
    """What Linear and Conv2d share: the policy, the call count, and adoption of a dense layer."""

    dropit_policy: Policy
    _channel_axis: int

    def _init_dropit(self, dropit_policy: Optional[Policy], fields: dict):
        self.dropit_policy = functional._policy_of(dropit_policy, fields)
        self._dropit_arguments = self.dropit_policy.arguments(self._channel_axis, 0)

    def _caches(self) -> bool:
        if not (self.training and torch.is_grad_enabled() and self.weight.requires_grad):
            return False
        if torch.jit.is_tracing():
            raise RuntimeError(f"{type(self).__name__}: a dropit layer in training mode cannot be "
                               "traced (the trace would record the dense operation); trace the "
                               "model in eval mode")
        return True

    def _call(self, operator, *arguments):
        """``operator`` (torch.ops.dropit.linear or conv2d) on ``arguments`` and the policy.
        Random selection draws afresh on every call: a key from torch's CPU generator, as dropout
        draws its mask, so torch.compile traces the draw (one graph for every step) and
        torch.utils.checkpoint, which restores the generator, recomputes the positions first
        drawn. The other policies do not depend on the call."""
        if self.dropit_policy.policy != "random":
            return operator(*arguments, *self._dropit_arguments)
        key = torch.randint(2**62, (), dtype=torch.int64, device="cpu")
        return operator(*arguments, *self._dropit_arguments, key)

    @classmethod
    def from_dense(cls, dense: nn.Module, dropit_policy: Optional[Policy] = None, **fields):
        """A dropit layer that shares ``dense``'s parameters, buffers, hooks and mode."""
        layer = cls.__new__(cls)
        # Registries and hooks are copied, their entries shared: a hook added to one of the two
        # modules later does not fire on the other.
        layer.__dict__.update({name: copy.copy(value) if isinstance(value, dict) else value
                               for name, value in dense.__dict__.items()})
        layer._init_dropit(dropit_policy, fields)
        return layer

    def extra_repr(self) -> str:
        p = self.dropit_policy
        return (f"{super().extra_repr()}, gamma={p.gamma}, policy={p.policy}, "
                f"granularity={p.granularity}")


class Linear(_CachingLayer, nn.Linear):
    """``torch.nn.Linear`` that caches its input compactly. Policy fields as in :class:`Policy`
    (gamma=0.9, policy="chunked_min_k", granularity="element", chunk_size=16384, ...)."""

    _channel_axis = -1

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None,
                 dtype=None, dropit_policy: Optional[Policy] = None, **fields):
        super().__init__(in_features, out_features, bias, device=device, dtype=dtype)
        self._init_dropit(dropit_policy, fields)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if not self._caches():
            return F.linear(input, self.weight, self.bias)
        return self._call(functional._linear, input, self.weight, self.bias)


class Conv2d(_CachingLayer, nn.Conv2d):
    """``torch.nn.Conv2d`` that caches its input compactly. Every padding torch accepts works:
    numbers, 'valid', 'same', and the non-zero padding modes (padded explicitly first, as torch
    does)."""

    _channel_axis = 1

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0,
                 dilation=1, groups: int = 1, bias: bool = True, padding_mode: str = "zeros",
                 device=None, dtype=None, dropit_policy: Optional[Policy] = None, **fields):
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation, groups,
                         bias, padding_mode, device=device, dtype=dtype)
        self._init_dropit(dropit_policy, fields)

    def _explicit_padding(self):
        """(padding applied by F.pad first or None, the conv's own symmetric zero padding)."""
        # torch keeps [left, right, top, bottom] for every padding, 'same' included.
        left, right, top, bottom = self._reversed_padding_repeated_twice
        if self.padding_mode == "zeros" and left == right and top == bottom:
            return None, (top, left)
        mode = "constant" if self.padding_mode == "zeros" else self.padding_mode
        return (mode, (left, right, top, bottom)), (0, 0)

    def _padded(self, input: torch.Tensor):
        """(the input the layer caches, the zero padding its convolution adds)."""
        pre_pad, padding = self._explicit_padding()
        if pre_pad is not None:
            mode, pads = pre_pad
            input = F.pad(input, pads, mode=mode)
        return input, padding

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if not self._caches():
            return self._conv_forward(input, self.weight, self.bias)
        if input.dim() == 3:  # unbatched [C, H, W], as torch accepts
            return self.forward(input.unsqueeze(0)).squeeze(0)
        input, padding = self._padded(input)
        return self._call(functional._conv2d, input, self.weight, self.bias, self.stride,
                          padding, self.dilation, self.groups)


class ReLU(nn.ReLU):
    """``torch.nn.ReLU`` that saves a 1-bit mask (where the output is positive) for backward
    instead of its output. With gradients it always returns a new tensor (``inplace`` applies
    only without gradients, where nothing is saved)."""

    @classmethod
    def from_dense(cls, dense: nn.ReLU) -> "ReLU":
        layer = cls(inplace=dense.inplace)
        layer.train(dense.training)
        return layer

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled() and input.requires_grad:
            return functional.relu(input)
        return F.relu(input, inplace=self.inplace)
