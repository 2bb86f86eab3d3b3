"""dropit.nn and dropit.functional against torch's own layers and autograd.

At gamma = 0 every output and gradient must equal torch's; at gamma > 0 the forward output, the
input gradient and the bias gradient stay exact, and the weight gradient must equal the dense
formula applied to densify(cache) of the layer's input, the cache rebuilt independently here with
dropit.functional.compress under the same policy.
"""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import dropit
from cache_sizes import chunked_min_k_bytes, relu_mask_bytes
from cases import DTYPES, POLICIES


def tolerance(dtype, scale):
    return {torch.float32: 1e-4, torch.float16: 2e-2, torch.bfloat16: 3e-2}[dtype] * max(scale, 1)


def assert_close(actual, expected, dtype=torch.float32):
    scale = expected.abs().max().item() if expected.numel() else 1.0
    torch.testing.assert_close(actual.float(), expected.float(), rtol=0,
                               atol=tolerance(dtype, scale))


def make_pair(dense: nn.Module, **policy):
    """A dropit layer sharing ``dense``'s parameters, and an independent dense copy of it."""
    reference = type(dense).__new__(type(dense))
    reference.__dict__.update(dense.__dict__)
    reference._parameters = {k: nn.Parameter(v.detach().clone()) if v is not None else None
                             for k, v in dense._parameters.items()}
    layer = {nn.Linear: dropit.nn.Linear, nn.Conv2d: dropit.nn.Conv2d}[type(dense)].from_dense(
        dense, **policy)
    return layer, reference


def run(module, x, dy):
    x = x.detach().clone().requires_grad_(True)
    y = module(x)
    y.backward(dy)
    return y.detach(), x.grad


def reference_or_skip(reference, x, dy):
    """Torch's own result, or a skip when this torch cannot run the layer in this dtype (1.13:
    no float16 matmul and no bfloat16 reflection padding on the CPU)."""
    try:
        return run(reference, x, dy)
    except (RuntimeError, NotImplementedError) as e:
        pytest.skip(f"torch {torch.__version__} itself cannot run this: {e}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(3, 5, 48), (7, 48), (48,)], ids=["3d", "2d", "1d"])
@pytest.mark.parametrize("bias", [True, False])
def test_linear_gamma_zero_equals_torch(dtype, shape, bias, device):
    dense = nn.Linear(48, 40, bias=bias).to(device, dtype)
    layer, reference = make_pair(dense, gamma=0.0)
    x = torch.randn(shape, dtype=dtype, device=device)
    dy = torch.randn(shape[:-1] + (40,), dtype=dtype, device=device)
    y_ref, dx_ref = reference_or_skip(reference, x, dy)
    y, dx = run(layer, x, dy)
    assert_close(y, y_ref, dtype)
    assert_close(dx, dx_ref, dtype)
    assert_close(layer.weight.grad, reference.weight.grad, dtype)
    if bias:
        assert_close(layer.bias.grad, reference.bias.grad, dtype)


CONVS = [
    dict(in_channels=4, out_channels=6, kernel_size=3, padding=1),
    dict(in_channels=4, out_channels=6, kernel_size=3, stride=2, padding=2, dilation=2,
         bias=False),
    dict(in_channels=6, out_channels=4, kernel_size=(3, 1), groups=2, padding=(1, 0)),
    dict(in_channels=4, out_channels=4, kernel_size=1),
    dict(in_channels=4, out_channels=6, kernel_size=3, padding="same"),
    dict(in_channels=4, out_channels=6, kernel_size=4, padding="same"),  # asymmetric 'same'
    dict(in_channels=4, out_channels=6, kernel_size=3, padding="valid"),
    dict(in_channels=4, out_channels=6, kernel_size=3, padding=1, padding_mode="reflect"),
    dict(in_channels=4, out_channels=6, kernel_size=3, padding=1, padding_mode="circular"),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("options", CONVS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()))
def test_conv2d_gamma_zero_equals_torch(dtype, options, device):
    dense = nn.Conv2d(**options).to(device, dtype)
    layer, reference = make_pair(dense, gamma=0.0)
    x = torch.randn(2, options["in_channels"], 9, 11, dtype=dtype, device=device)
    try:
        dy = torch.randn_like(reference(x))
    except (RuntimeError, NotImplementedError) as e:
        pytest.skip(f"torch {torch.__version__} itself cannot run this layer: {e}")
    y_ref, dx_ref = run(reference, x, dy)
    y, dx = run(layer, x, dy)
    assert_close(y, y_ref, dtype)
    assert_close(dx, dx_ref, dtype)
    assert_close(layer.weight.grad, reference.weight.grad, dtype)
    if layer.bias is not None:
        assert_close(layer.bias.grad, reference.bias.grad, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: ",".join(map(str, p.values())))
def test_linear_weight_grad_is_dense_formula_on_densified_cache(dtype, policy, device):
    x = torch.randn(6, 7, 32, dtype=dtype, device=device)
    weight = torch.randn(24, 32, dtype=dtype, device=device, requires_grad=True)
    bias = torch.randn(24, dtype=dtype, device=device, requires_grad=True)
    dy = torch.randn(6, 7, 24, dtype=dtype, device=device)
    try:
        expected_y = F.linear(x, weight, bias)
    except (RuntimeError, NotImplementedError) as e:
        pytest.skip(f"torch {torch.__version__} itself cannot run this: {e}")
    xg = x.clone().requires_grad_(True)
    y = dropit.functional.linear(xg, weight, bias, gamma=0.8, **policy)
    y.backward(dy)

    assert_close(y, expected_y, dtype)
    assert_close(xg.grad, dy @ weight.detach(), dtype)
    assert_close(bias.grad, dy.sum((0, 1)), dtype)
    cache = dropit.functional.compress(x, gamma=0.8, channel_axis=-1, **policy)
    kept = dropit.functional.densify(cache).float()
    assert (kept != 0).sum() <= cache.kept
    expected = dy.reshape(-1, 24).float().t() @ kept.reshape(-1, 32)
    assert_close(weight.grad, expected.to(dtype), dtype)
    # Something was dropped, so the gradient differs from the dense one.
    assert not torch.allclose(weight.grad.float(), dy.reshape(-1, 24).float().t()
                              @ x.reshape(-1, 32).float(), atol=1e-3)


# gamma 0.7 takes the densify path on the CPU, 0.99 the sparse kernel (the layer's backward then
# computes the input gradient on its own).
@pytest.mark.parametrize("gamma", [0.7, 0.99])
@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: ",".join(map(str, p.values())))
def test_conv2d_weight_grad_is_dense_formula_on_densified_cache(policy, gamma, device):
    x = torch.randn(2, 6, 10, 9, device=device)
    weight = torch.randn(8, 3, 3, 3, device=device, requires_grad=True)
    bias = torch.randn(8, device=device, requires_grad=True)
    conv = dict(stride=(2, 1), padding=(1, 2), dilation=(1, 2), groups=2)
    xg = x.clone().requires_grad_(True)
    y = dropit.functional.conv2d(xg, weight, bias, gamma=gamma, **conv, **policy)
    dy = torch.randn_like(y)
    y.backward(dy)

    x_ref = x.clone().requires_grad_(True)
    w_ref = weight.detach().clone().requires_grad_(True)
    y_ref = F.conv2d(x_ref, w_ref, bias.detach(), **conv)
    y_ref.backward(dy)
    assert_close(y, y_ref)
    assert_close(xg.grad, x_ref.grad)
    assert_close(bias.grad, dy.sum((0, 2, 3)))

    kept = dropit.functional.densify(dropit.functional.compress(x, gamma=gamma, channel_axis=1,
                                                                **policy))
    # The dense formula: torch's own weight gradient of a convolution whose input is `kept`.
    kept = kept.clone().requires_grad_(False)
    w_formula = weight.detach().clone().requires_grad_(True)
    F.conv2d(kept, w_formula, None, **conv).backward(dy)
    assert_close(weight.grad, w_formula.grad)
    assert not torch.allclose(weight.grad, w_ref.grad, atol=1e-3)


def strided(dz, layout):
    """``dz``'s values with the given strides: as they are, transposed in memory (channels last
    for 4-D), or one row broadcast over the first axis (stride 0), as ``y.sum().backward()`` and
    ``expand`` hand a backward."""
    if layout == "transposed":
        if dz.dim() == 4:
            return dz.contiguous(memory_format=torch.channels_last)
        return dz.transpose(-1, -2).contiguous().transpose(-1, -2)
    if layout == "expanded":
        return dz[:1].expand_as(dz)
    return dz


@pytest.mark.parametrize("path", ["sparse", "densify", "auto"])
@pytest.mark.parametrize("gamma", [0.5, 0.9, 0.99])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("dz_layout", ["contiguous", "transposed", "expanded"])
def test_every_weight_grad_path_is_the_dense_formula(path, gamma, dtype, dz_layout, device):
    x = torch.randn(42, 32, device=device, dtype=dtype)
    dz = strided(torch.randn(42, 24, device=device, dtype=dtype), dz_layout)
    cache = dropit.functional.compress(x, gamma=gamma, chunk_size=64)
    kept = dropit.functional.densify(cache).float()
    dw = torch.ops.dropit.linear_weight_grad(cache.values, cache.positions, cache.layout, dz, path)
    assert dw.dtype == dtype
    assert_close(dw, dz.float().t() @ kept, dtype)

    x = torch.randn(2, 6, 10, 9, device=device, dtype=dtype)
    weight = torch.randn(8, 3, 3, 3, device=device)
    conv = dict(stride=(2, 1), padding=(1, 2), dilation=(1, 2), groups=2)
    dz = strided(torch.randn_like(F.conv2d(x.float(), weight, None, **conv)).to(dtype), dz_layout)
    cache = dropit.functional.compress(x, gamma=gamma, chunk_size=64)
    kept = dropit.functional.densify(cache).float()
    w_formula = weight.clone().requires_grad_(True)
    F.conv2d(kept, w_formula, None, **conv).backward(dz.float())
    dw = torch.ops.dropit.conv2d_weight_grad(cache.values, cache.positions, cache.layout, dz,
                                      list(weight.shape), **conv, path=path)
    assert dw.dtype == dtype
    assert_close(dw, w_formula.grad, dtype)


@pytest.mark.parametrize("dense", [nn.Linear(48, 40), nn.Conv2d(4, 6, 3, padding=1)],
                         ids=["linear", "conv2d"])
def test_layers_take_dz_of_any_strides(dense, device):
    """``y.sum().backward()`` hands the backward a dZ of stride 0; a transposed dZ has no unit
    stride on its last axis: the layers' gradients equal torch's for both."""
    dense = dense.to(device)
    shape = (3, 5, 48) if isinstance(dense, nn.Linear) else (2, 4, 7, 6)
    x = torch.randn(shape, device=device)
    for layout in ["expanded", "transposed"]:
        dense.zero_grad(set_to_none=True)  # the dropit layer shares its parameters
        layer, reference = make_pair(dense, gamma=0.0)
        dy = strided(torch.randn_like(reference(x)), layout)
        _, dx_ref = run(reference, x, dy)
        _, dx = run(layer, x, dy)
        assert_close(dx, dx_ref)
        assert_close(layer.weight.grad, reference.weight.grad)
        assert_close(layer.bias.grad, reference.bias.grad)


def test_layers_reading_one_tensor_share_its_cache(device):
    """A residual block's first conv and its shortcut read the same activation: one cache serves
    both (nothing more is held for the second), until the tensor is written in place."""
    x = torch.randn(8, 16, 12, 12, device=device)
    body = dropit.nn.Conv2d(16, 16, 3, padding=1, bias=False, gamma=0.9).to(device)
    between = dropit.nn.Conv2d(16, 16, 3, padding=1, bias=False, gamma=0.9).to(device)
    shortcut = dropit.nn.Conv2d(16, 32, 1, bias=False, gamma=0.9).to(device)
    cache_bytes = chunked_min_k_bytes(x.numel(), 0.9, 16384, 4)
    with dropit.memory.measure(device) as first:
        y_body = body(x)
    y_between = between(torch.relu(y_body.detach()))  # another layer compresses in between
    with dropit.memory.measure(device) as second:
        y_shortcut = shortcut(x)
    output_bytes = y_shortcut.numel() * 4
    assert first.retained_bytes >= y_body.numel() * 4 + cache_bytes
    assert second.retained_bytes - output_bytes < cache_bytes // 4  # the layout words only

    cache = dropit.functional.compress(x, gamma=0.9)
    kept = dropit.functional.densify(cache)
    dz_body, dz_shortcut = torch.randn_like(y_body), torch.randn_like(y_shortcut)
    (y_body * dz_body).sum().add((y_shortcut * dz_shortcut).sum()).add(y_between.sum()).backward()
    for layer, dz in ((body, dz_body), (shortcut, dz_shortcut)):
        w_formula = layer.weight.detach().clone().requires_grad_(True)
        F.conv2d(kept, w_formula, None, padding=layer.padding).backward(dz)
        assert_close(layer.weight.grad, w_formula.grad)

    x.mul_(2)  # written in place: the next layer compresses it afresh
    with dropit.memory.measure(device) as after_write:
        y_again = shortcut(x)
    assert after_write.retained_bytes >= y_again.numel() * 4 + cache_bytes


def test_weight_grad_path_choice():
    def preferred(gamma, conv2d, row_width, taps, device="cpu", dtype=torch.float32):
        cache = dropit.functional.compress(torch.randn(4096, dtype=dtype), gamma=gamma)
        return dropit._C.preferred_weight_grad_path(cache.layout, conv2d, row_width, taps, device)

    # On the CPU the sparse kernel only from the crossovers the weight_grad benchmark measured,
    # which lie closer to 1 where AVX-512 is used (oneDNN's dense kernels are faster there).
    wide = dropit._C.cpu_isa == "avx512"
    assert preferred(0.5, True, 64, 9) == "densify"
    assert preferred(0.9, True, 64, 9) == ("densify" if wide else "sparse")
    assert preferred(0.95, True, 64, 9) == "sparse"
    assert preferred(0.95, True, 32, 9) == ("densify" if wide else "sparse")
    assert preferred(0.97, True, 32, 9) == "sparse"
    assert preferred(0.9, True, 16, 9) == "densify"
    assert preferred(0.99, True, 16, 9) == "sparse"
    assert preferred(0.95, True, 32, 1) == "densify"
    assert preferred(0.99, True, 32, 1) == "sparse"
    assert preferred(0.9, False, 288, 1) == "densify"
    assert preferred(0.97, False, 96, 1) == "densify"
    assert preferred(0.999, False, 96, 1) == ("densify" if wide else "sparse")
    # 16-bit caches: the sparse kernel, which accumulates in float and rounds once.
    assert preferred(0.5, True, 64, 9, dtype=torch.bfloat16) == "sparse"
    # Elsewhere torch's library kernels on the densified cache.
    assert preferred(0.99, True, 64, 9, "meta") == "densify"
    with pytest.raises(ValueError, match="'fast'.*'auto', 'sparse' or 'densify'"):
        cache = dropit.functional.compress(torch.randn(64), gamma=0.5)
        torch.ops.dropit.linear_weight_grad(cache.values, cache.positions, cache.layout,
                                     torch.randn(1, 8), "fast")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
@pytest.mark.parametrize("contiguous", [True, False])
def test_relu_equals_torch(dtype, contiguous, device):
    x = torch.randn(4, 33, 7, dtype=dtype, device=device)
    x[0, 0, :3] = 0.0  # ReLU's gradient at 0 is 0 in torch
    if not contiguous:
        x = x.transpose(0, 2)
    dy = torch.randn_like(x)
    y_ref, dx_ref = reference_or_skip(nn.ReLU(), x, dy)
    y, dx = run(dropit.nn.ReLU(), x, dy)
    assert torch.equal(y, y_ref)
    assert torch.equal(dx, dx_ref)


def test_relu_saves_one_bit_per_element(device):
    x = torch.randn(64, 1024, device=device, requires_grad=True)
    with dropit.memory.measure(device) as dense:
        y = nn.ReLU()(x.clone())
    del y
    with dropit.memory.measure(device) as masked:
        y = dropit.nn.ReLU()(x.clone())
    output_bytes = x.numel() * 4
    # Both keep the output alive here; dense also holds it for backward (no extra bytes), dropit
    # holds a mask of one bit per element on top (the clone is freed in both).
    assert masked.retained_bytes - dense.retained_bytes == relu_mask_bytes(x.numel())
    assert dense.retained_bytes == output_bytes


# Each padding as F.pad applies it (last dimension first): 'same' for a 4-wide kernel pads 1
# before and 2 after, as torch's own layer does. The layer caches the padded input.
@pytest.mark.parametrize("padding,mode,pads,pad_mode", [
    ("same", "zeros", (1, 2, 1, 2), "constant"),
    (1, "reflect", (1, 1, 1, 1), "reflect"),
    (2, "circular", (2, 2, 2, 2), "circular")])
def test_padded_conv_weight_grad_is_dense_formula_on_the_padded_cache(padding, mode, pads,
                                                                      pad_mode):
    layer = dropit.nn.Conv2d(3, 5, 4, padding=padding, padding_mode=mode, gamma=0.7,
                             chunk_size=64)
    x = torch.randn(2, 3, 10, 9)
    y = layer(x)
    dy = torch.randn_like(y)
    y.backward(dy)
    padded = F.pad(x, pads, mode=pad_mode)
    kept = dropit.functional.densify(dropit.functional.compress(padded, gamma=0.7, chunk_size=64))
    w = layer.weight.detach().clone().requires_grad_(True)
    F.conv2d(kept, w, None, layer.stride, 0, layer.dilation, layer.groups).backward(dy)
    assert_close(layer.weight.grad, w.grad)


def test_unbatched_conv_input_like_torch():
    layer = dropit.nn.Conv2d(3, 4, 3, padding=1, gamma=0.0)
    x = torch.randn(3, 6, 6, requires_grad=True)
    y = layer(x)
    assert y.shape == (4, 6, 6)
    torch.testing.assert_close(y, F.conv2d(x.unsqueeze(0), layer.weight, layer.bias,
                                           padding=1).squeeze(0))


def test_functional_random_draws_per_call():
    x = torch.randn(16, 64)
    grads = []
    for call in (0, 0, 1):
        w = torch.randn(4, 64, generator=torch.Generator().manual_seed(0)).requires_grad_(True)
        dropit.functional.linear(x, w, policy="random", chunk_size=64, gamma=0.5,
                                 call=call).sum().backward()
        grads.append(w.grad)
    assert torch.equal(grads[0], grads[1]) and not torch.equal(grads[0], grads[2])


def test_training_mode_tracing_is_refused_clearly():
    layer = dropit.nn.Linear(4, 3)
    with pytest.raises(RuntimeError, match="cannot be traced"):
        torch.jit.trace(layer, torch.randn(2, 4, requires_grad=True), check_trace=False)
    layer.eval()
    traced = torch.jit.trace(layer, torch.randn(2, 4))
    x = torch.randn(2, 4)
    torch.testing.assert_close(traced(x), layer(x))


def test_from_dense_hooks_added_later_stay_with_their_module():
    dense = nn.Linear(3, 3)
    layer = dropit.nn.Linear.from_dense(dense)
    calls = []
    layer.register_forward_hook(lambda *args: calls.append("dropit"))
    dense(torch.randn(1, 3))
    assert calls == []


def test_eval_and_no_grad_run_the_dense_forward():
    layer = dropit.nn.Linear(16, 8, gamma=0.9)
    x = torch.randn(5, 16, requires_grad=True)
    with torch.no_grad():
        assert layer(x).grad_fn is None
    layer.eval()
    y = layer(x)
    assert "linear_function" not in y.grad_fn.name()
    layer.train()
    assert layer(x).grad_fn.name() == "dropit::LinearBackward"


NODE_CASES = {
    # (layer, input, the tensors its node keeps: the weight and the cache's values and positions;
    # the mask)
    "linear": (lambda: dropit.nn.Linear(16, 8, gamma=0.5), (6, 16), 3),
    "conv2d": (lambda: dropit.nn.Conv2d(3, 4, 3, padding=1, gamma=0.5), (2, 3, 8, 8), 3),
    "relu": (lambda: dropit.nn.ReLU(), (6, 16), 1),
}


@pytest.mark.parametrize("name", NODE_CASES)
def test_layer_nodes_keep_their_tensors_as_torchs_nodes_do(name):
    make, shape, kept = NODE_CASES[name]
    torch.manual_seed(0)
    layer = make()
    x = torch.randn(*shape, requires_grad=True)
    inputs = [x, *layer.parameters()]
    y = layer(x)
    assert y.grad_fn.name() == f"dropit::{type(layer).__name__}Backward"
    upstream = torch.randn_like(y)
    expected = torch.autograd.grad(y, inputs, upstream)

    # Saved-tensor hooks (checkpointing, offloading) see every tensor the node keeps, and the
    # node computes from what they give back.
    stored = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: stored.append(t) or len(stored) - 1,
                                                  lambda index: stored[index]):
        y = layer(x)
    assert len(stored) == kept
    # A retained graph gives the same gradients twice; a freed one refuses in torch's words.
    for retain in (True, False):
        got = torch.autograd.grad(y, inputs, upstream, retain_graph=retain)
        for g, e in zip(got, expected):
            assert torch.equal(g, e)
    with pytest.raises(RuntimeError, match="second time"):
        torch.autograd.grad(y, inputs, upstream)

    # torch.autograd.graph's node creation hooks, where torch has them, see the node.
    if hasattr(torch.autograd.graph, "node_creation_hook"):
        created = []
        with torch.autograd.graph.node_creation_hook(lambda node: created.append(node.name())):
            layer(x)
        assert f"dropit::{type(layer).__name__}Backward" in created

    # Forward-mode gradients through a node are refused, not silently dropped.
    with torch.autograd.forward_ad.dual_level():
        dual = torch.autograd.forward_ad.make_dual(x, torch.ones_like(x))
        with pytest.raises(ValueError, match="no forward-mode gradient"):
            layer(dual)


def test_random_selection_draws_afresh_each_call():
    layer = dropit.nn.Linear(64, 4, bias=False, policy="random", chunk_size=64, gamma=0.5)
    x = torch.randn(8, 64)
    grads = []
    for seed in (1, 2, 1):
        torch.manual_seed(seed)  # the draw follows torch's generator, as dropout's does
        layer.weight.grad = None
        layer(x).sum().backward()
        grads.append(layer.weight.grad.clone())
    assert not torch.equal(grads[0], grads[1]) and torch.equal(grads[0], grads[2])


def test_non_contiguous_input_is_accepted_by_the_layers():
    layer = dropit.nn.Linear(12, 5, gamma=0.0)
    x = torch.randn(12, 6).t()  # non-contiguous view
    assert not x.is_contiguous()
    torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias))


def test_layers_keep_torch_state_dicts():
    dense = nn.Conv2d(3, 5, 3, padding=1)
    layer = dropit.nn.Conv2d(3, 5, 3, padding=1)
    assert layer.state_dict().keys() == dense.state_dict().keys()
    layer.load_state_dict(dense.state_dict())
    assert torch.equal(layer.weight, dense.weight)
    assert isinstance(layer, nn.Conv2d) and isinstance(dropit.nn.Linear(2, 3), nn.Linear)


@pytest.mark.parametrize("layer_type", [dropit.nn.Linear, dropit.nn.Conv2d])
def test_parametrized_weight_is_read_through_its_parametrization(layer_type):
    """A layer reads a registered parameter from the module's registry; a weight under
    torch.nn.utils.parametrize is a property instead, and must still be computed and trained
    through (at gamma 0 the gradients are torch's for the same parametrized layer)."""
    torch.manual_seed(0)
    dense = nn.Linear(6, 5) if layer_type is dropit.nn.Linear else nn.Conv2d(3, 4, 3, padding=1)
    x = torch.randn(2, 6) if layer_type is dropit.nn.Linear else torch.randn(2, 3, 5, 5)

    class Doubled(nn.Module):
        def forward(self, weight):
            return 2 * weight

    layer, reference = make_pair(dense, gamma=0.0)
    for module in (layer, reference):
        nn.utils.parametrize.register_parametrization(module, "weight", Doubled())
    dy = torch.randn_like(reference(x))
    outputs = [module(x) for module in (layer, reference)]
    assert_close(outputs[0], outputs[1])
    for output in outputs:
        output.backward(dy)
    original = [m.parametrizations.weight.original for m in (layer, reference)]
    assert_close(original[0].grad, original[1].grad)
    assert_close(layer.bias.grad, reference.bias.grad)
