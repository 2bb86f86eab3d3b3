"""Fake (meta) kernels of dropit's operators, registered in C++ as torch.ops.dropit.* (see
python/src/operators.cpp). A cache's size follows from the input's shape, dtype and the policy
alone, so torch.compile and FakeTensor know every output without running a kernel.

The layers (linear, conv2d, relu) need none: their autograd kernel calls these operators, and
without gradients they are torch's own dense operations.
"""

import hashlib

import torch

from . import _C

_LIBRARY = "dropit"


def _shape(tensor: torch.Tensor) -> list:
    # Caches are planned for concrete shapes: a symbolic size is specialised (guarded on).
    return [int(size) for size in tensor.shape]


@torch.library.register_fake(f"{_LIBRARY}::compress")
def _compress_fake(input, selection, granularity, channel_axis, gamma, chunk_size, seed, call,
                   rescale, call_key=None):
    policy = _C.PolicyArguments(selection, granularity, channel_axis, gamma, chunk_size, seed, call,
                                rescale)
    plan = _C.plan(_shape(input), str(input.dtype).replace("torch.", ""), policy)
    return (input.new_empty(plan["kept"]),
            input.new_empty(plan["position_words"], dtype=torch.int32))


@torch.library.register_fake(f"{_LIBRARY}::densify")
def _densify_fake(values, positions, layout, call_key=None):
    return values.new_empty(_C.describe(list(layout))["shape"])


@torch.library.register_fake(f"{_LIBRARY}::linear_weight_grad")
def _linear_weight_grad_fake(values, positions, layout, dz, path="auto", call_key=None):
    shape = _C.describe(list(layout))["shape"]
    return dz.new_empty(int(dz.shape[-1]), shape[-1] if shape else 0)


@torch.library.register_fake(f"{_LIBRARY}::conv2d_weight_grad")
def _conv2d_weight_grad_fake(values, positions, layout, dz, weight_size, stride, padding,
                             dilation, groups, path="auto", call_key=None):
    return dz.new_empty(list(weight_size))


def _kernel_format(tensor: torch.Tensor) -> torch.memory_format:
    """The memory format the C++ kernels read a tensor in and the ReLU keeps (kernel_memory_format
    in dropit/torch/tensor.hpp)."""
    if (tensor.dim() == 4 and not tensor.is_contiguous()
            and tensor.is_contiguous(memory_format=torch.channels_last)):
        return torch.channels_last
    return torch.contiguous_format


@torch.library.register_fake(f"{_LIBRARY}::relu_with_mask")
def _relu_with_mask_fake(input):
    words = _C.relu_mask_words(input.numel())
    return (torch.empty_like(input, memory_format=_kernel_format(input)),
            input.new_empty(words, dtype=torch.int32))


@torch.library.register_fake(f"{_LIBRARY}::relu_backward")
def _relu_backward_fake(grad, mask):
    # The mask is in logical order whatever the layout: the gradient keeps its own.
    return torch.empty_like(grad, memory_format=_kernel_format(grad))


def compile_cache_tag() -> str:
    """A digest of dropit's operator schemas as they are registered now."""
    schemas = sorted(str(torch._C._get_schema(name, ""))
                     for name in torch._C._dispatch_get_all_op_names()
                     if name.startswith(f"{_LIBRARY}::"))
    return "dropit-" + hashlib.sha256("\n".join(schemas).encode()).hexdigest()[:16]


def tag_compile_caches() -> None:
    """Adds `compile_cache_tag()` to the tag torch.compile puts in its cache keys. A compiled graph
    cached on disk is keyed by the forward graph dynamo traced, where a dropit layer is one call;
    the operators its autograd kernel called, backward's included, are only in the cached code. So
    a graph cached against another build of dropit could call its operators with the arguments of
    their old schemas; with the tag, a build whose schemas differ misses that cache."""
    config = getattr(torch.compiler, "config", None)
    if config is None or not hasattr(config, "cache_key_tag"):
        return  # a torch whose caches have no such tag
    tag = compile_cache_tag()
    if tag not in config.cache_key_tag.split():
        config.cache_key_tag = f"{config.cache_key_tag} {tag}".strip()
