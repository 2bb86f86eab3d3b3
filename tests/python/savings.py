"""What a converted model should save, derived from the encodings (cache_sizes.py), independently
of the library, and what it does save, measured at the allocator.

Every distinct tensor a converted layer reads for its weight gradient is, in the dense model, kept
alive for backward; dropit keeps its cache instead (or nothing, where a linear layer reads a
converted producer's output and recomputes it), and a converted ReLU keeps a 1-bit mask instead of
its output. Not the output of torch's fused attention, which the attention itself keeps for its
backward: a layer reading it (an output projection) saves nothing there, dense or not."""

# The autograd nodes of torch's fused attention kernels, which save their output.
FUSED_ATTENTION = ("ScaledDotProductFlashAttentionForCpuBackward0",
                   "ScaledDotProductFlashAttentionBackward0",
                   "ScaledDotProductEfficientAttentionBackward0",
                   "ScaledDotProductCudnnAttentionBackward0")


def _attention_output(tensor) -> bool:
    base = tensor if tensor._base is None else tensor._base
    return base.grad_fn is not None and base.grad_fn.name() in FUSED_ATTENTION

import torch

import dropit
from cache_sizes import chunked_min_k_bytes, relu_mask_bytes


def _loss(out) -> torch.Tensor:
    """A scalar of a model's output: a tensor, or a Hugging Face output's logits."""
    out = getattr(out, "logits", out)
    return out.float().square().mean()


def _output_bytes(out) -> int:
    out = getattr(out, "logits", out)
    return out.numel() * out.element_size()


def held_after_forward_and_step_peak(model, *args, **kwargs):
    """(bytes the forward leaves allocated besides its output, peak bytes of the whole step)."""
    model.train()
    device = next(model.parameters()).device
    with dropit.memory.measure(device) as forward:
        out = model(*args, **kwargs)
    with dropit.memory.measure(device) as backward:
        _loss(out).backward()
    model.zero_grad(set_to_none=True)
    held = forward.retained_bytes - _output_bytes(out)
    return held, max(forward.peak_bytes, forward.retained_bytes + backward.peak_bytes)


def _read_for_weight_gradient(layer, args, kwargs, produced) -> list:
    """(key, numel, element bytes, cached) of each tensor ``layer`` reads for its weight gradient,
    read off its arguments (the key identifies a tensor several layers read: the tensor itself,
    kept alive so that its storage is not reused). A linear layer caches nothing of a converted
    producer's output (in ``produced``): it recomputes it."""
    if isinstance(layer, dropit.nn.MultiheadAttention):
        names = ("query", "key", "value", "key_padding_mask", "need_weights")
        given = dict(zip(names, args), **kwargs)
        query, key, value = given["query"], given["key"], given["value"]
        recomputed = query is key and key is value and id(query) in produced
        read = [(query, not recomputed)] + [(t, True) for t in (key, value)
                                            if t is not query and t is not key]
        tensors = [(t, t.numel(), t.element_size(), cached) for t, cached in read]
        if not given.get("need_weights", True):
            # The output projection reads the fused attention's output, which the attention keeps.
            return tensors
        # ... or else a new tensor of the query's size.
        out_numel = query.numel() // query.shape[-1] * layer.embed_dim
        return tensors + [(object(), out_numel, query.element_size(), True)]
    input = args[0]
    if isinstance(layer, (dropit.nn.Conv1d, dropit.nn.Conv2d, dropit.nn.Conv3d)):
        assert layer.padding_mode == "zeros", "a padded copy is not the tensor read"
        return [(input, input.numel(), input.element_size(), True)]
    if _attention_output(input):
        return []
    return [(input, input.numel(), input.element_size(), id(input) not in produced)]


def predicted_saving(model, *args, **kwargs) -> int:
    """Bytes the converted ``model`` should hold less than the dense one after a training forward
    on these arguments (chunked min-k)."""
    inputs = {}  # id(key) -> [dense bytes, planned cache bytes, key]
    masks, hooks = [], []
    produced = {}  # id -> output of a converted LayerNorm, GELU or SiLU (kept: ids stay unique)

    def cached(layer, args, kwargs):
        policy = layer.dropit_policy
        assert policy.policy == "chunked_min_k"
        for key, numel, element, is_cached in _read_for_weight_gradient(layer, args, kwargs,
                                                                        produced):
            entry = inputs.setdefault(id(key), [numel * element, 0, key])
            if is_cached:
                entry[1] += chunked_min_k_bytes(numel, policy.gamma, policy.chunk_size, element)

    def masked(layer, args, out):
        masks.append(relu_mask_bytes(out.numel()))

    def producer(layer, args, out):
        produced[id(out)] = out

    for m in model.modules():
        if isinstance(m, dropit.nn.ReLU):
            hooks.append(m.register_forward_hook(masked))
        elif isinstance(m, (dropit.nn.LayerNorm, dropit.nn.GELU, dropit.nn.SiLU)):
            hooks.append(m.register_forward_hook(producer))
        elif hasattr(m, "dropit_policy"):
            hooks.append(m.register_forward_pre_hook(cached, with_kwargs=True))
    with torch.enable_grad():  # the autograd graph says which tensor is the attention's
        model(*args, **kwargs)
    for hook in hooks:
        hook.remove()
    return sum(dense - cache for dense, cache, _ in inputs.values()) - sum(masks)
