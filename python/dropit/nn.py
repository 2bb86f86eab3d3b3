"""Drop-in replacements for torch.nn.Linear, Conv1d, Conv2d, Conv3d, MultiheadAttention and ReLU,
and for Hugging Face's Conv1D.

They are subclasses of torch's modules with the same parameters, buffers and state dicts. In
training mode with gradients enabled, the linear and convolution layers save a compact cache of
their input (the weight gradient is computed from it; the input gradient stays exact), attention
caches the inputs of its projections, and ReLU saves a 1-bit mask;
in eval mode or under ``torch.no_grad`` they run torch's own dense forward.
"""

import copy
import functools
import math
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from torch import nn

from . import _C, _convolution, _reuse, functional
from ._policy import Policy

__all__ = ["BatchNorm2d", "Checkpoint", "Conv1d", "Conv2d", "Conv3d", "Dropout", "GELU",
           "LayerNorm", "Linear", "MultiheadAttention", "ReLU", "SiLU", "TransposedLinear"]


def _weight_and_bias(module: nn.Module) -> tuple:
    """(module.weight, module.bias) without nn.Module.__getattr__ for registered parameters (a
    Python function, called only after the ordinary lookup fails: a cost a small layer's call
    notices). Anything else (a parametrization's property) is read as usual."""
    parameters = module._parameters
    if "weight" in parameters and "bias" in parameters:
        return parameters["weight"], parameters["bias"]
    return module.weight, module.bias


class _CachingLayer:
    """What Linear and Conv2d share: the policy, the call count, and adoption of a dense layer."""

    dropit_policy: Policy
    _channel_axis: int

    def _init_dropit(self, dropit_policy: Optional[Policy], fields: dict):
        self.dropit_policy = functional._policy_of(dropit_policy, fields)
        self._dropit_arguments = self.dropit_policy.arguments(self._channel_axis, 0)
        self._policy_arguments = _C.PolicyArguments(*self._dropit_arguments)
        self._draws_keys = self.dropit_policy.policy == "random"

    def _weight_gradient_inputs(self, input: torch.Tensor) -> list:
        """(tensor, cached) for each tensor the layer reads for its weight gradient in a call on
        these arguments, which the dense layer saves: cached, or else needing no cache."""
        return [(input, True)]

    def _learns(self) -> bool:
        """Whether a weight the layer caches its input for needs a gradient."""
        return _weight_and_bias(self)[0].requires_grad

    # Set by convert's skip_first on a layer found fed by the model's own input in the model's
    # first forward (the model may be wrapped by then, so the layer stays): it runs dense.
    _runs_dense = False
    # Set by convert's recompute_layers: an input recomputable through a layer's forward counts,
    # and the output of a recomputed input is marked recomputable in turn.
    _recompute_layers = False

    def _caches(self, weight: Optional[torch.Tensor] = None) -> bool:
        """Whether this call caches; ``weight``: the layer's weight, already read (else
        ``_learns`` decides)."""
        learns = self._learns() if weight is None else weight.requires_grad
        if not (self.training and learns and torch.is_grad_enabled()) or self._runs_dense:
            return False
        # torch.jit.is_tracing() less its scripting test; dynamo (torch 2.11) cannot trace the call
        if not torch.compiler.is_compiling() and torch._C._is_tracing():
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
        key = None
        if self._draws_keys:
            key = torch.randint(2**62, (), dtype=torch.int64, device="cpu")
        direct = functional._DIRECT.get(operator)
        if direct is not None and functional._direct(arguments[:3]):  # input, weight, bias
            return direct(*arguments, self._policy_arguments, key)
        if key is None:
            return operator(*arguments, *self._dropit_arguments)
        return operator(*arguments, *self._dropit_arguments, key)

    def _plain_call(self, input: torch.Tensor, *parameters) -> bool:
        """Whether this call is the common one, which the operator's direct entry serves alone:
        eager, on plain tensors, no key to draw, and an input that is no view (of attention's
        output) and no producer's output (see _reuse)."""
        return (not self._draws_keys and not _reuse.carries_recipe(input)
                and functional._direct((input, *parameters)) and input._base is None)

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

    def _policy_repr(self) -> str:
        if self._runs_dense:
            return "dense (skip_first: its input is the model's)"
        p = self.dropit_policy
        return f"gamma={p.gamma}, policy={p.policy}, granularity={p.granularity}"

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, {self._policy_repr()}"


class _LinearLayer(_CachingLayer):
    """What Linear and TransposedLinear share: an input that needs no cache (_reuse) is not
    cached."""

    _channel_axis = -1

    def _weight_gradient_inputs(self, input: torch.Tensor) -> list:
        return [(input, not _reuse.reusable(input, self._recompute_layers))]


class Linear(_LinearLayer, nn.Linear):
    """``torch.nn.Linear`` that caches its input compactly. Policy fields as in :class:`Policy`
    (gamma=0.9, policy="chunked_min_k", granularity="element", chunk_size=16384, ...)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None,
                 dtype=None, dropit_policy: Optional[Policy] = None, **fields):
        super().__init__(in_features, out_features, bias, device=device, dtype=dtype)
        self._init_dropit(dropit_policy, fields)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        weight, bias = _weight_and_bias(self)
        if not self._caches(weight):
            return F.linear(input, weight, bias)
        if self._plain_call(input, weight, bias):
            return _C.linear(input, weight, bias, self._policy_arguments, None)
        if _reuse.left_to_compiler(input):
            return F.linear(input, weight, bias)
        output = _reuse.linear_reusing_input(input, weight, bias, self._recompute_layers)
        if output is not None:
            return output
        return self._call(functional._linear, input, weight, bias)


class TransposedLinear(_LinearLayer, nn.Module):
    """Hugging Face's ``Conv1D`` (GPT-2 and the models built like it): a linear layer whose weight
    is stored [in_features, out_features] (``nx``, ``nf``), with the same parameters and state
    dict, that caches its input compactly. ``from_dense`` adopts one."""

    def __init__(self, nf: int, nx: int, device=None, dtype=None,
                 dropit_policy: Optional[Policy] = None, **fields):
        super().__init__()
        self.nf, self.nx = nf, nx
        self.weight = nn.Parameter(torch.empty(nx, nf, device=device, dtype=dtype))
        self.bias = nn.Parameter(torch.zeros(nf, device=device, dtype=dtype))
        nn.init.normal_(self.weight, std=0.02)
        self._init_dropit(dropit_policy, fields)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        weight, bias = _weight_and_bias(self)
        if not self._caches(weight) or _reuse.left_to_compiler(input):
            # Hugging Face's own computation
            shape = input.shape[:-1] + (self.nf,)
            return torch.addmm(bias, input.view(-1, input.size(-1)), weight).view(shape)
        output = _reuse.linear_reusing_input(input, weight.t(), bias, self._recompute_layers)
        if output is not None:
            return output
        return self._call(functional._linear, input, weight.t(), bias)

    def extra_repr(self) -> str:
        return f"nf={self.nf}, nx={self.nx}, {self._policy_repr()}"


class _Convolution(_CachingLayer):
    """What Conv1d, Conv2d and Conv3d share: every padding torch accepts (numbers, 'valid',
    'same', and the non-zero padding modes, padded explicitly first as torch does), unbatched
    inputs, and the dense path."""

    _channel_axis = 1

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0,
                 dilation=1, groups: int = 1, bias: bool = True, padding_mode: str = "zeros",
                 device=None, dtype=None, dropit_policy: Optional[Policy] = None, **fields):
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation, groups,
                         bias, padding_mode, device=device, dtype=dtype)
        self._init_dropit(dropit_policy, fields)

    def _explicit_padding(self):
        """(padding applied by F.pad first or None, the convolution's own symmetric zero
        padding)."""
        if self.padding_mode == "zeros" and not isinstance(self.padding, str):
            return None, self.padding  # what torch's own forward reads on every call
        # torch keeps [before, after] pairs, last dimension first, for every padding ('same' too).
        pads = list(self._reversed_padding_repeated_twice)
        before, after = pads[0::2], pads[1::2]
        if self.padding_mode == "zeros" and before == after:
            return None, tuple(reversed(before))
        mode = "constant" if self.padding_mode == "zeros" else self.padding_mode
        return (mode, tuple(pads)), (0,) * len(before)

    @staticmethod
    def _pre_padded(input: torch.Tensor, pre_pad) -> torch.Tensor:
        """``input`` with the padding ``_explicit_padding`` applies first: what the layer caches."""
        if pre_pad is None:
            return input
        mode, pads = pre_pad
        return F.pad(input, pads, mode=mode)

    def _padded(self, input: torch.Tensor):
        """(the input the layer caches, the zero padding its convolution adds)."""
        pre_pad, padding = self._explicit_padding()
        return self._pre_padded(input, pre_pad), padding

    def _weight_gradient_inputs(self, input: torch.Tensor) -> list:
        if input.dim() == len(self.kernel_size) + 1:
            input = input.unsqueeze(0)
        if (self._explicit_padding()[0] is None
                and _reuse.recomputable(input, self._recompute_layers)):
            return [(input, False)]
        return [(self._padded(input)[0], True)]

    def _direct_forward(self, input: torch.Tensor, weight, bias) -> Optional[torch.Tensor]:
        """The common call (batched, zero-padded, on an input that is no producer's output) through
        the operator's direct entry, as Linear's; None where it is not that call."""
        return None

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        weight, bias = _weight_and_bias(self)
        if not self._caches(weight):
            return self._conv_forward(input, weight, bias)
        output = self._direct_forward(input, weight, bias)
        if output is not None:
            return output
        if _reuse.left_to_compiler(input):
            return self._conv_forward(input, weight, bias)
        dims = len(self.kernel_size)
        if input.dim() == dims + 1:  # unbatched, as torch accepts
            return self.forward(input.unsqueeze(0)).squeeze(0)
        if input.dim() != dims + 2:
            raise ValueError(f"dropit.nn.{type(self).__name__}: input of shape "
                             f"{list(input.shape)}; expected {dims + 2} dimensions [N, C, ...] "
                             f"or {dims + 1} (unbatched)")
        pre_pad, padding = self._explicit_padding()
        if pre_pad is None:
            output = _reuse.convolution_recomputing_input(input, weight, bias, self.stride,
                                                          padding, self.dilation, self.groups,
                                                          self._recompute_layers)
            if output is not None:
                return output
        return self._convolve(self._pre_padded(input, pre_pad), weight, bias, padding)


class Conv1d(_Convolution, nn.Conv1d):
    """``torch.nn.Conv1d`` that caches its input compactly: a Conv2d of height one, run by
    dropit's conv2d operator (its sparse weight gradient included)."""

    def _weight_gradient_inputs(self, input: torch.Tensor) -> list:
        return [(read.unsqueeze(2), cached)
                for read, cached in super()._weight_gradient_inputs(input)]

    def _convolve(self, input: torch.Tensor, weight, bias, padding) -> torch.Tensor:
        return self._call(functional._conv2d, input.unsqueeze(2), weight.unsqueeze(2), bias,
                          (1, *self.stride), (0, *padding), (1, *self.dilation),
                          self.groups).squeeze(2)


class Conv2d(_Convolution, nn.Conv2d):
    """``torch.nn.Conv2d`` that caches its input compactly."""

    def _direct_forward(self, input: torch.Tensor, weight, bias) -> Optional[torch.Tensor]:
        # The plain call first: a producer's output leaves it at its second test.
        if (self._plain_call(input, weight, bias) and input.dim() == 4
                and self.padding_mode == "zeros" and not isinstance(self.padding, str)):
            return _C.conv2d(input, weight, bias, self.stride, self.padding, self.dilation,
                             self.groups, self._policy_arguments, None)
        return None

    def _convolve(self, input: torch.Tensor, weight, bias, padding) -> torch.Tensor:
        return self._call(functional._conv2d, input, weight, bias, self.stride, padding,
                          self.dilation, self.groups)


class Conv3d(_Convolution, nn.Conv3d):
    """``torch.nn.Conv3d`` that caches its input compactly. dropit has no sparse 3-D weight
    gradient: backward densifies the cache and runs torch's own convolution backward on it."""

    def _convolve(self, input: torch.Tensor, weight, bias, padding) -> torch.Tensor:
        device = input.device.type
        if torch.is_autocast_enabled(device):  # as torch's conv3d: the autocast dtype, cache too
            dtype = torch.get_autocast_dtype(device)
            input, weight = input.to(dtype), weight.to(dtype)
            bias = None if bias is None else bias.to(dtype)
        return self._call(_convolution.convolution, input, weight, bias, list(self.stride),
                          list(padding), list(self.dilation), self.groups)[0]


class MultiheadAttention(_CachingLayer, nn.MultiheadAttention):
    """``torch.nn.MultiheadAttention`` whose input and output projections cache their inputs
    compactly, with the same parameters, state dict and results (masks, ``need_weights``,
    ``is_causal``, ``batch_first``, unbatched inputs); attention runs through torch's
    ``scaled_dot_product_attention``, or explicitly where the weights are returned, as torch's
    does. ``add_bias_kv`` and ``add_zero_attn`` are not supported. In eval mode or without gradients
    it is torch's module."""

    _channel_axis = -1

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0, bias: bool = True,
                 add_bias_kv: bool = False, add_zero_attn: bool = False, kdim=None, vdim=None,
                 batch_first: bool = False, device=None, dtype=None,
                 dropit_policy: Optional[Policy] = None, **fields):
        if add_bias_kv or add_zero_attn:
            raise ValueError("dropit.nn.MultiheadAttention does not support add_bias_kv=True or "
                             "add_zero_attn=True; use torch.nn.MultiheadAttention")
        super().__init__(embed_dim, num_heads, dropout, bias, add_bias_kv, add_zero_attn, kdim,
                         vdim, batch_first, device=device, dtype=dtype)
        self._init_dropit(dropit_policy, fields)

    def _projection_weights(self) -> tuple:
        if self._qkv_same_embed_dim:
            return self.in_proj_weight, self.out_proj.weight
        return self.q_proj_weight, self.k_proj_weight, self.v_proj_weight, self.out_proj.weight

    def _learns(self) -> bool:
        return any(weight.requires_grad for weight in self._projection_weights())

    def _weight_gradient_inputs(self, query, key, value, key_padding_mask=None,
                                need_weights=True, *args, **kwargs) -> list:
        recomputed = query is key and key is value and _reuse.recipe_of(query) is not None
        read = [(query, not recomputed)] + [(t, True) for t in (key, value)
                                            if t is not query and t is not key]
        if not need_weights:  # the fused attention keeps the out-projection's input (forward)
            return read
        out_proj_input = torch.empty(query.shape[:-1] + (self.embed_dim,), dtype=query.dtype,
                                     device="meta")
        return read + [(out_proj_input, True)]

    def _linear(self, input, weight, bias):
        return self._call(functional._linear, input, weight, bias)

    def _project_inputs(self, query, key, value, self_attention: bool, shared_key_value: bool,
                        recipe, dense_projection: bool):
        """q, k, v as torch's in-projection computes them, each projection caching its input;
        a self-attention's one input recomputed by ``recipe``, or left to the compiler where
        ``dense_projection`` (see _reuse)."""
        embed_dim = self.embed_dim
        if not self._qkv_same_embed_dim:
            weights = (self.q_proj_weight, self.k_proj_weight, self.v_proj_weight)
            biases = (None,) * 3 if self.in_proj_bias is None else self.in_proj_bias.chunk(3)
            return tuple(self._linear(x, w, b)
                         for x, w, b in zip((query, key, value), weights, biases))
        weight, bias = self.in_proj_weight, self.in_proj_bias
        if self_attention:  # one projection of one input, split into q, k, v
            if dense_projection:
                packed = F.linear(query, weight, bias)
            elif recipe is None:
                packed = self._linear(query, weight, bias)
            else:
                recompute, sources = recipe
                packed = _reuse.RecomputedInputLinear.apply(query, weight, bias, recompute,
                                                            *sources)
            packed = packed.unflatten(-1, (3, embed_dim)).unsqueeze(0).transpose(0, -2)
            packed = packed.squeeze(-2).contiguous()
            return packed[0], packed[1], packed[2]
        if shared_key_value:
            weight_q, weight_kv = weight.split([embed_dim, 2 * embed_dim])
            bias_q, bias_kv = (None, None) if bias is None else bias.split(
                [embed_dim, 2 * embed_dim])
            packed = self._linear(key, weight_kv, bias_kv)
            packed = packed.unflatten(-1, (2, embed_dim)).unsqueeze(0).transpose(0, -2)
            packed = packed.squeeze(-2).contiguous()
            return self._linear(query, weight_q, bias_q), packed[0], packed[1]
        biases = (None,) * 3 if bias is None else bias.chunk(3)
        return tuple(self._linear(x, w, b)
                     for x, w, b in zip((query, key, value), weight.chunk(3), biases))

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                key_padding_mask: Optional[torch.Tensor] = None, need_weights: bool = True,
                attn_mask: Optional[torch.Tensor] = None, average_attn_weights: bool = True,
                is_causal: bool = False):
        if not self._caches():
            return super().forward(query, key, value, key_padding_mask, need_weights, attn_mask,
                                   average_attn_weights, is_causal)
        self_attention, shared_key_value = query is key and key is value, key is value
        # A self-attention input a producer can recompute: the projection caches nothing.
        recipe, dense_projection = None, False
        if self_attention:
            if torch.compiler.is_compiling():
                dense_projection = _reuse.left_to_compiler(query)
            else:
                recipe = _reuse.recipe_of(query)
        batched = query.dim() == 3
        arrange = _sequence_first if batched and self.batch_first else (
            _single_batch if not batched else None)
        if arrange is not None:
            query, key, value = (arrange(t) for t in (query, key, value))
            if not batched and key_padding_mask is not None:
                key_padding_mask = key_padding_mask.unsqueeze(0)
            if recipe is not None:
                recipe = (functools.partial(_arranged, arrange, recipe[0]), recipe[1])
        target_length, batch, embed_dim = query.shape
        source_length, heads, head_dim = key.shape[0], self.num_heads, self.head_dim

        key_padding_mask = _additive_mask(key_padding_mask, query.dtype, "key_padding_mask")
        attn_mask = _additive_mask(attn_mask, query.dtype, "attn_mask")
        if is_causal and attn_mask is None:
            raise ValueError("dropit.nn.MultiheadAttention: is_causal=True is a hint that needs "
                               "attn_mask, as torch's nn.MultiheadAttention")
        # As torch: the causal hint is used only where the mask need not be materialised.
        causal = is_causal and key_padding_mask is None and not need_weights
        if causal:
            attn_mask = None
        elif attn_mask is not None:
            expected = ((target_length, source_length) if attn_mask.dim() == 2 else
                        (batch * heads, target_length, source_length))
            if tuple(attn_mask.shape) != expected:
                raise ValueError(f"attn_mask of shape {tuple(attn_mask.shape)}; expected "
                                   f"{expected}")
            if attn_mask.dim() == 2:
                attn_mask = attn_mask.unsqueeze(0)
        if key_padding_mask is not None:
            if tuple(key_padding_mask.shape) != (batch, source_length):
                raise ValueError(f"key_padding_mask of shape {tuple(key_padding_mask.shape)}; "
                                   f"expected {(batch, source_length)}")
            padding = key_padding_mask.view(batch, 1, 1, source_length).expand(
                -1, heads, -1, -1).reshape(batch * heads, 1, source_length)
            attn_mask = padding if attn_mask is None else attn_mask + padding

        q, k, v = self._project_inputs(query, key, value, self_attention, shared_key_value, recipe,
                                       dense_projection)
        q = q.view(target_length, batch * heads, head_dim).transpose(0, 1)
        k = k.view(source_length, batch * heads, head_dim).transpose(0, 1)
        v = v.view(source_length, batch * heads, head_dim).transpose(0, 1)
        dropout = self.dropout if self.training else 0.0
        weights, attention_keeps_output = None, False
        if need_weights:
            scaled = q * math.sqrt(1.0 / float(head_dim))
            if attn_mask is None:
                weights = torch.bmm(scaled, k.transpose(-2, -1))
            else:
                weights = torch.baddbmm(attn_mask, scaled, k.transpose(-2, -1))
            weights = F.softmax(weights, dim=-1)
            if dropout > 0.0:
                weights = F.dropout(weights, p=dropout)
            output = torch.bmm(weights, v).transpose(0, 1)
        else:
            if attn_mask is not None:
                attn_mask = (attn_mask.unsqueeze(0) if attn_mask.size(0) == 1 else
                             attn_mask.view(batch, heads, -1, source_length))
            q, k, v = (t.view(batch, heads, -1, head_dim) for t in (q, k, v))
            output = F.scaled_dot_product_attention(q, k, v, attn_mask, dropout, causal)
            output = output.permute(2, 0, 1, 3)
            # Where the fused attention lays its output out [L, N, H, D], the output projection
            # reads that very tensor, which the attention keeps (see _reuse; decided
            # from the layout here, so that torch.compile decides the same).
            attention_keeps_output = output.is_contiguous()
        output = output.contiguous().view(target_length * batch, embed_dim)
        if attention_keeps_output:
            output = F.linear(output, self.out_proj.weight, self.out_proj.bias)
        else:
            output = self._linear(output, self.out_proj.weight, self.out_proj.bias)
        output = output.view(target_length, batch, -1)
        if weights is not None:
            weights = weights.view(batch, heads, target_length, source_length)
            if average_attn_weights:
                weights = weights.mean(dim=1)
        if not batched:
            output = output.squeeze(1)
            weights = None if weights is None else weights.squeeze(0)
        elif self.batch_first:
            output = output.transpose(0, 1)
        return output, weights


def _sequence_first(t: torch.Tensor) -> torch.Tensor:
    return t.transpose(0, 1)


def _single_batch(t: torch.Tensor) -> torch.Tensor:
    return t.unsqueeze(1)


def _arranged(arrange, recompute, *sources) -> torch.Tensor:
    return arrange(recompute(*sources))


def _additive_mask(mask: Optional[torch.Tensor], dtype: torch.dtype, name: str):
    """A boolean mask (True: may not attend) as the float mask torch adds to the scores."""
    if mask is None or mask.is_floating_point():
        return mask if mask is None else mask.to(dtype)
    if mask.dtype != torch.bool:
        raise TypeError(f"{name} of dtype {mask.dtype}; only bool and floating-point masks are "
                        "supported")
    return torch.zeros_like(mask, dtype=dtype).masked_fill_(mask, float("-inf"))


class _Producer:
    """What LayerNorm, BatchNorm2d, GELU and SiLU share: their output, read by a dropit linear or
    convolution layer (directly or through a dropit ReLU), is recomputed in that layer's backward
    from the input they keep for their own backward anyway, so the layer caches nothing and its
    weight gradient is the dense one (after BatchNorm in training, within rounding). With
    ``_recompute_layers`` (convert's recompute_layers), one reading the output of a layer whose
    input is recomputed keeps none of its input: backward runs that layer's forward again."""

    _recompute_layers = False

    @classmethod
    def from_dense(cls, dense: nn.Module):
        """A producer with ``dense``'s parameters, buffers, hooks and mode."""
        layer = cls.__new__(cls)
        layer.__dict__.update({name: copy.copy(value) if isinstance(value, dict) else value
                               for name, value in dense.__dict__.items()})
        return layer

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if self._recompute_layers:
            output = _reuse.produce_recomputing_input(input, super().forward, self._recompute,
                                                      getattr(self, "weight", None),
                                                      getattr(self, "bias", None))
            if output is not None:
                return output
        if torch.compiler.is_compiling():
            return _reuse.produce_for_compiler(super().forward, input)
        output = super().forward(input)
        if output is input:  # in place: nothing left to recompute from
            return output
        return _reuse.mark_recomputable(output, self._recompute, input, native=self._native(input))

    def _native(self, input: torch.Tensor) -> Optional[tuple]:
        """The same recomputation as the C++ one takes it (``_reuse.mark_recomputable``)."""
        return None


class LayerNorm(_Producer, nn.LayerNorm):
    """``torch.nn.LayerNorm`` whose output a dropit linear layer recomputes instead of caching."""

    def _recompute(self, input: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(input, self.normalized_shape, self.weight, self.bias, self.eps)

    def _native(self, input: torch.Tensor) -> Optional[tuple]:
        return ("layer_norm", (input, *_weight_and_bias(self)), list(self.normalized_shape),
                self.eps, "none")


class BatchNorm2d(_Producer, nn.BatchNorm2d):
    """``torch.nn.BatchNorm2d`` whose output (or a dropit ReLU's of it) a dropit convolution or
    linear layer recomputes instead of caching. Running statistics move as torch's do; the
    recomputation normalises with what the forward used (the batch's statistics in training,
    without touching the running ones; the running ones otherwise). With the batch's statistics
    that the forward's kernel saved for its backward (torch's native one, or cuDNN's), the
    recomputation is one affine pass (the kernel rounds it in its own order: equal to the forward's
    output within rounding, on the CPU within the last bit); without them it runs the kernel
    again."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        batch_statistics = self.training or not self.track_running_stats
        if self._recompute_layers:
            output = _reuse.produce_recomputing_input(
                input, functools.partial(nn.BatchNorm2d.forward, self),
                functools.partial(self._recompute, batch_statistics), self.weight, self.bias)
            if output is not None:
                return output
        output = nn.BatchNorm2d.forward(self, input)
        statistics = _native_batch_statistics(output) if batch_statistics else None
        if statistics is not None:
            return _reuse.mark_recomputable(
                output, self._normalise, input, *statistics,
                native=("batch_norm", (input, *_weight_and_bias(self), *statistics), [], 0.0,
                        "none"))
        recompute = functools.partial(self._recompute, batch_statistics)
        return _reuse.mark_recomputable(output, recompute, input)

    def _normalise(self, input: torch.Tensor, mean: torch.Tensor,
                   invstd: torch.Tensor) -> torch.Tensor:
        """The forward's output again from the batch's statistics, in one pass without a reduction
        over the batch: the LibTorch adapters' recomputation, which the layers reading this output
        run in C++ too."""
        return _C.batch_norm_from_statistics(input, self.weight, self.bias, mean, invstd)

    def _recompute(self, batch_statistics: bool, input: torch.Tensor) -> torch.Tensor:
        if batch_statistics:
            return F.batch_norm(input, None, None, self.weight, self.bias, True, 0.0, self.eps)
        return F.batch_norm(input, self.running_mean, self.running_var, self.weight, self.bias,
                            False, 0.0, self.eps)


def _saved_tensor_hooks_active() -> bool:
    """Whether saved-tensor hooks are in force (a non-reentrant checkpoint, ``save_on_cpu``):
    reading a node's saved tensors would run their unpack hook in forward (a checkpoint would run
    its region again). True when this torch cannot tell."""
    top = getattr(torch._C._autograd, "_top_saved_tensors_default_hooks", None)
    return top is None or top(False) is not None


# The autograd nodes of the batch-norm kernels whose saved result1 and result2 are the batch's mean
# and inverse standard deviation: torch's native kernel's, and cuDNN's in training (torch's own
# decomposition of cudnn_batch_norm returns native_batch_norm's results as its first three).
_BATCH_STATISTICS_NODES = ("NativeBatchNormBackward0", "CudnnBatchNormBackward0")


def _native_batch_statistics(output: torch.Tensor) -> Optional[Tuple[torch.Tensor, torch.Tensor]]:
    """The batch's mean and inverse standard deviation that the batch-norm kernel (torch's native
    one, or cuDNN's) saved for the backward of ``output``; None when autograd did not record them,
    another kernel produced it, or saved-tensor hooks would run on reading them."""
    if (not torch.is_grad_enabled() or torch.compiler.is_compiling()
            or _saved_tensor_hooks_active()):
        return None
    node = output.grad_fn
    if node is None or type(node).__name__ not in _BATCH_STATISTICS_NODES:
        return None
    return node._saved_result1, node._saved_result2


class GELU(_Producer, nn.GELU):
    """``torch.nn.GELU`` whose output a dropit linear layer recomputes instead of caching."""

    def _recompute(self, input: torch.Tensor) -> torch.Tensor:
        return F.gelu(input, approximate=self.approximate)

    def _native(self, input: torch.Tensor) -> Optional[tuple]:
        return "gelu", (input,), [], 0.0, self.approximate


class SiLU(_Producer, nn.SiLU):
    """``torch.nn.SiLU`` whose output a dropit linear layer recomputes instead of caching."""

    def _recompute(self, input: torch.Tensor) -> torch.Tensor:
        return F.silu(input)

    def _native(self, input: torch.Tensor) -> Optional[tuple]:
        return "silu", (input,), [], 0.0, "none"


class Dropout(nn.Dropout):
    """``torch.nn.Dropout`` that returns its input itself where it drops nothing (``p`` 0, or in
    eval mode), as eager torch does but a traced dropout does not: so that under torch.compile a
    layer reading a producer's output through it (torchvision's ViT MLP: GELU -> Dropout(0.0) ->
    Linear) still sees that output and leaves it to the compiler."""

    @classmethod
    def from_dense(cls, dense: nn.Dropout) -> "Dropout":
        layer = cls(p=dense.p, inplace=dense.inplace)
        layer.train(dense.training)
        return layer

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if self.p == 0.0 or not self.training:
            return input
        return super().forward(input)


class ReLU(nn.ReLU):
    """``torch.nn.ReLU`` that saves a 1-bit mask (where the output is positive) for backward
    instead of its output. With gradients it always returns a new tensor (``inplace`` applies
    only without gradients, where nothing is saved). Applied to a producer's untouched output
    (BatchNorm2d's, say), its own output is recomputable too: the producer's, then this ReLU."""

    @classmethod
    def from_dense(cls, dense: nn.ReLU) -> "ReLU":
        layer = cls(inplace=dense.inplace)
        layer.train(dense.training)
        return layer

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if not (torch.is_grad_enabled() and input.requires_grad):
            return F.relu(input, inplace=self.inplace)
        compiling = torch.compiler.is_compiling()  # asked once: a Python call of its own
        if compiling and _reuse.left_to_compiler(input):
            # no mask: the compiler fuses it with the producer
            return _reuse.leave_to_compiler(F.relu(input))
        # functional.relu, its tests made once
        direct = functional._direct((input,), compiling)
        output = _C.relu(input) if direct else functional._relu(input)
        found = None if compiling else _reuse.marked(input)
        if found is None:
            return output
        recompute, sources, runs_layer = found
        native, relu = _reuse.native_of_marked(input)
        return _reuse.mark_recomputable(output, functools.partial(_relu_of, recompute), *sources,
                                        runs_layer=runs_layer, native=None if relu else native,
                                        relu=True)


def _relu_of(recompute, *sources) -> torch.Tensor:
    # In place on the recomputed producer output, which nothing else holds: one activation
    # transient in backward, as dense holds. max(x, 0), as dropit's ReLU kernel computes it.
    return F.relu(recompute(*sources), inplace=True)


class Checkpoint(nn.Module):
    """Runs ``block`` under ``torch.utils.checkpoint`` (non-reentrant; random generators restored,
    so dropout replays): it holds the block's inputs only and runs the block again in backward.
    The block is a submodule (parameters, ``to()`` and ``train()`` reach it), but the state dict is
    the block's own, so a checkpointed model saves and loads as the dense one."""

    def __init__(self, block: nn.Module):
        super().__init__()
        self.block = block
        self._register_state_dict_hook(_drop_block_prefix)
        self._register_load_state_dict_pre_hook(_add_block_prefix)

    def forward(self, *args, **kwargs):
        if not torch.is_grad_enabled():
            return self.block(*args, **kwargs)
        return torch.utils.checkpoint.checkpoint(self.block, *args, use_reentrant=False, **kwargs)


def _drop_block_prefix(module, state_dict, prefix, local_metadata):
    for key in [key for key in state_dict if key.startswith(prefix + "block.")]:
        state_dict[prefix + key[len(prefix) + len("block."):]] = state_dict.pop(key)


def _add_block_prefix(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                      error_msgs):
    for key in [key for key in state_dict
                if key.startswith(prefix) and not key.startswith(prefix + "block.")]:
        state_dict[prefix + "block." + key[len(prefix):]] = state_dict.pop(key)
