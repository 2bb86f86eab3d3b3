"""dropit.convert on real model trees: torchvision's ResNet-18 and a ViT, and hand-built trees with
attributes, Sequential, ModuleList, ModuleDict and shared modules; the layers it converts besides
Linear and Conv2d (Conv1d, Conv3d, MultiheadAttention, Hugging Face's Conv1D), each against
torch's own layer; skip_first."""

import copy
import io
import math

import pytest
import torch
from torch import nn

import dropit
from cache_sizes import chunked_min_k_bytes
from cases import Conv1D, Sequence

torchvision = pytest.importorskip("torchvision", reason="torchvision is not installed")


def small_vit():
    return torchvision.models.VisionTransformer(image_size=32, patch_size=8, num_layers=2,
                                                num_heads=2, hidden_dim=32, mlp_dim=64,
                                                num_classes=10)


def layers_of(model, types):
    """Names of the modules of exactly these types, but not the projections that
    nn.MultiheadAttention holds (it uses their weights itself)."""
    inside_attention = {f"{name}.{child}" for name, m in model.named_modules()
                        if isinstance(m, nn.MultiheadAttention) for child, _ in m.named_children()}
    return {name for name, m in model.named_modules()
            if type(m) in types and name not in inside_attention}


LINEAR_CONV = (nn.Linear, nn.Conv2d, nn.modules.linear.NonDynamicallyQuantizableLinear,
               nn.MultiheadAttention)


@pytest.mark.parametrize("make,shape", [(torchvision.models.resnet18, (2, 3, 64, 64)),
                                        (small_vit, (2, 3, 32, 32))], ids=["resnet18", "vit"])
def test_convert_keeps_eval_outputs_state_dict_and_reports_every_layer(make, shape):
    model = make()
    original = copy.deepcopy(model)
    candidates = layers_of(model, LINEAR_CONV)
    x = torch.randn(shape)
    report = dropit.convert(model, gamma=0.9, example_input=x)

    reported = {layer.name for layer in report.converted + report.skipped}
    assert candidates <= reported, candidates - reported
    for layer in report.converted:
        if layer.kind in ("Linear", "Conv2d"):
            numel = math.prod(layer.input_shape)
            assert layer.dense_bytes == 4 * numel
            expected = 0 if layer.reuses_input else chunked_min_k_bytes(numel, 0.9, 16384, 4)
            assert layer.cache_bytes == expected, layer.name
    converted = {layer.name for layer in report.converted}
    assert any(isinstance(m, (dropit.nn.Linear, dropit.nn.Conv2d))
               for m in model.modules())
    for name, module in model.named_modules():
        if name in converted and name in candidates:
            assert isinstance(module, (dropit.nn.Linear, dropit.nn.Conv2d,
                                       dropit.nn.MultiheadAttention)), name
    # Only the layer fed by the model's input is left, and why.
    assert [(layer.name, "model's own input" in layer.reason) for layer in report.skipped] == [
        ("conv1" if make is torchvision.models.resnet18 else "conv_proj", True)]

    model.eval()
    original.eval()
    with torch.no_grad():
        assert torch.equal(model(x), original(x))
    assert model.state_dict().keys() == original.state_dict().keys()
    restored = make()
    dropit.convert(restored)
    restored.load_state_dict(original.state_dict())
    restored.eval()
    with torch.no_grad():
        assert torch.equal(restored(x), original(x))


def test_resnet18_training_step_at_gamma_zero_equals_dense():
    model = torchvision.models.resnet18(num_classes=10)
    reference = copy.deepcopy(model)
    report = dropit.convert(model, gamma=0.0)
    assert len(report.converted) > 20
    x = torch.randn(2, 3, 32, 32)
    model(x).square().sum().backward()
    reference(x).square().sum().backward()
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-4, msg=name)


def test_vit_attention_is_converted_whole_with_its_projections():
    model = small_vit()
    reference = copy.deepcopy(model)
    report = dropit.convert(model, gamma=0.0, example_input=torch.randn(2, 3, 32, 32))
    kinds = {layer.name: layer.kind for layer in report.converted}
    attention = [name for name in kinds if name.endswith("self_attention")]
    assert len(attention) == 2 and all(kinds[n] == "MultiheadAttention" for n in attention)
    assert not any(name.endswith("out_proj") for name in kinds)
    x = torch.randn(2, 3, 32, 32)
    model(x).square().sum().backward()
    reference(x).square().sum().backward()
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5, msg=name)


class Tree(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Linear(8, 8)
        self.shared = nn.Linear(8, 8)
        self.blocks = nn.ModuleList([nn.Sequential(nn.Linear(8, 8), nn.ReLU()), self.shared])
        self.heads = nn.ModuleDict({"a": nn.Linear(8, 3), "b": nn.Conv2d(1, 1, 1)})
        self.act = nn.ReLU()

    def forward(self, x):
        x = self.act(self.stem(x))
        for block in self.blocks:
            x = block(x)
        return self.heads["a"](self.shared(x))


def test_convert_reaches_attributes_containers_and_shared_modules():
    model = Tree()
    report = dropit.convert(model, exclude=[r"heads\.b"], example_input=torch.randn(4, 8))
    assert isinstance(model.stem, nn.Linear) and not isinstance(model.stem, dropit.nn.Linear)
    assert isinstance(model.blocks[0][0], dropit.nn.Linear)
    assert isinstance(model.blocks[0][1], dropit.nn.ReLU)
    assert isinstance(model.act, dropit.nn.ReLU)
    assert isinstance(model.heads["a"], dropit.nn.Linear)
    assert type(model.heads["b"]) is nn.Conv2d
    # A module held in two places is replaced by one dropit module in both.
    assert isinstance(model.shared, dropit.nn.Linear) and model.blocks[1] is model.shared
    skipped = {layer.name: layer.reason for layer in report.skipped}
    assert "exclude" in skipped["heads.b"] and "skip_first" in skipped["stem"]
    assert "already" in str(dropit.convert(model))
    model(torch.randn(4, 8)).sum().backward()
    assert model.shared.weight.grad is not None


def test_convert_shares_parameters_and_saves_whole_models():
    model = nn.Sequential(nn.Linear(6, 6), nn.ReLU(), nn.Linear(6, 2))
    weight = model[2].weight
    dropit.convert(model, gamma=0.5, policy="random", seed=3)
    assert model[2].weight is weight
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    assert isinstance(loaded[2], dropit.nn.Linear)
    assert loaded[2].dropit_policy == model[2].dropit_policy
    x = torch.randn(3, 6)
    torch.testing.assert_close(loaded(x), model(x))


def test_a_module_held_twice_gets_one_decision():
    class Aliased(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(4, 4)
            self.b = nn.Linear(4, 4)
            self.c = self.a  # the excluded layer again, under another name

        def forward(self, x):
            return self.c(self.b(self.a(x)))

    model = Aliased()
    report = dropit.convert(model, skip_first=False, exclude=[r"^a$"])
    assert model.a is model.c and type(model.a) is nn.Linear
    assert isinstance(model.b, dropit.nn.Linear)
    assert [layer.name for layer in report.converted] == ["b"]


def test_report_sizes_the_tensor_a_padded_conv_caches():
    model = nn.Sequential(nn.Linear(2, 2), nn.Conv2d(3, 4, 3, padding=1, padding_mode="reflect"),
                          nn.Conv2d(4, 4, 4, padding="same"))
    model[0] = nn.Identity()  # only the convolutions matter here
    report = dropit.convert(model, skip_first=False, gamma=0.5, chunk_size=64,
                            example_input=torch.randn(2, 3, 8, 8))
    sizes = {layer.name: layer for layer in report.converted}
    assert sizes["1"].input_shape == (2, 3, 10, 10)  # reflect-padded by one on each side
    assert sizes["2"].input_shape == (2, 4, 11, 11)  # 'same' for an even kernel pads 1 + 2
    for layer in sizes.values():
        assert layer.cache_bytes == chunked_min_k_bytes(math.prod(layer.input_shape), 0.5, 64, 4)
    # ... and that is what the layers really cache.
    x = torch.randn(2, 3, 8, 8)
    padded = torch.nn.functional.pad(x, (1, 1, 1, 1), mode="reflect")
    cache = dropit.functional.compress(padded, gamma=0.5, chunk_size=64)
    assert cache.nbytes - sizes["1"].cache_bytes in range(0, 4)  # positions padded to 32 bits


def converted(layer: nn.Module, **fields) -> nn.Module:
    """``layer`` converted on its own (a copy; skip_first off)."""
    holder = nn.Sequential(copy.deepcopy(layer))
    report = dropit.convert(holder, skip_first=False, **fields)
    assert [entry.name for entry in report.converted] == ["0"], str(report)
    return holder[0]


CONVOLUTIONS = {
    "conv1d": (lambda: nn.Conv1d(4, 6, 3, stride=2, padding=1), (2, 4, 33)),
    "conv1d-reflect-dilated": (lambda: nn.Conv1d(4, 6, 3, dilation=2, padding=2,
                                                 padding_mode="reflect"), (2, 4, 33)),
    "conv1d-grouped-same-unbatched": (lambda: nn.Conv1d(4, 6, 4, groups=2, padding="same"),
                                      (4, 20)),
    "conv3d": (lambda: nn.Conv3d(4, 6, 3, stride=(1, 2, 2), padding=1), (2, 4, 5, 9, 9)),
    "conv3d-grouped-same-circular": (lambda: nn.Conv3d(4, 6, (1, 3, 3), groups=2, padding="same",
                                                       padding_mode="circular"), (2, 4, 3, 8, 8)),
    "conv3d-unbatched": (lambda: nn.Conv3d(3, 2, 2, bias=False), (3, 4, 5, 6)),
}


@pytest.mark.parametrize("name", CONVOLUTIONS)
def test_conv1d_and_conv3d_equal_torch_at_gamma_zero(name):
    make, shape = CONVOLUTIONS[name]
    dense = make()
    layer = converted(dense, gamma=0.0)
    assert type(layer).__name__ == type(dense).__name__ and isinstance(layer, type(dense))
    x = torch.randn(shape, requires_grad=True)
    x_dense = x.detach().clone().requires_grad_()
    y, y_dense = layer(x), dense(x_dense)
    torch.testing.assert_close(y, y_dense)
    dy = torch.randn_like(y)
    y.backward(dy)
    y_dense.backward(dy)
    torch.testing.assert_close(x.grad, x_dense.grad)
    for (parameter, p), q in zip(layer.named_parameters(), dense.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5, msg=parameter)
    layer.eval()
    with torch.no_grad():
        assert torch.equal(layer(x), dense(x))


@pytest.mark.parametrize("dims", [1, 3])
def test_conv1d_and_conv3d_weight_gradient_is_torchs_on_the_kept_elements(dims):
    """At gamma 0.9 the weight gradient is torch's on the densified cache (the kept elements in
    place, zeros elsewhere); the input gradient stays exact."""
    dense = (nn.Conv1d if dims == 1 else nn.Conv3d)(4, 6, 3, padding=1)
    layer = converted(dense, gamma=0.9, chunk_size=256)
    x = torch.randn((2, 4, 40) if dims == 1 else (2, 4, 6, 7, 8), requires_grad=True)
    y = layer(x)
    dy = torch.randn_like(y)
    y.backward(dy)
    kept = dropit.functional.densify(dropit.functional.compress(x.detach(), gamma=0.9,
                                                                chunk_size=256))
    assert 0.09 < kept.count_nonzero().item() / kept.numel() < 0.11
    weight_grad = getattr(torch.nn.grad, f"conv{dims}d_weight")
    torch.testing.assert_close(layer.weight.grad,
                               weight_grad(kept, dense.weight.shape, dy, padding=1))
    x_dense = x.detach().clone().requires_grad_()
    dense(x_dense).backward(dy)
    torch.testing.assert_close(x.grad, x_dense.grad)
    torch.testing.assert_close(layer.bias.grad, dy.sum(dim=[0, *range(2, dy.dim())]))


def test_hugging_face_conv1d_is_a_linear_with_a_transposed_weight():
    dense = Conv1D(12, 8)
    layer = converted(dense, gamma=0.0)
    assert isinstance(layer, dropit.nn.TransposedLinear)
    assert layer.state_dict().keys() == dense.state_dict().keys()
    assert layer.weight is not dense.weight and layer.weight.shape == (8, 12)
    x = torch.randn(3, 5, 8)
    y, y_dense = layer(x), dense(x)
    torch.testing.assert_close(y, y_dense)
    y.square().sum().backward()
    y_dense.square().sum().backward()
    torch.testing.assert_close(layer.weight.grad, dense.weight.grad)
    torch.testing.assert_close(layer.bias.grad, dense.bias.grad)
    layer.eval()
    with torch.no_grad():
        assert torch.equal(layer(x), dense(x))


def attention_inputs(kind, batch_first, length=5, source=6, batch=3):
    """(query, key, value); a causal call needs equal lengths: pass source=length."""
    def sequence(n, width, batched=True):
        if not batched:
            return torch.randn(n, width)
        return torch.randn((batch, n, width) if batch_first else (n, batch, width))

    if kind == "self":
        x = sequence(length, 16)
        return x, x, x
    if kind == "shared-key-value":
        memory = sequence(source, 16)
        return sequence(length, 16), memory, memory
    if kind == "unbatched":
        x = sequence(length, 16, batched=False)
        return x, x, x
    return sequence(length, 16), sequence(source, 16), sequence(source, 16)


ATTENTION_CALLS = {
    "no-weights": dict(need_weights=False),
    "weights": dict(),
    "weights-per-head": dict(average_attn_weights=False),
    "bool-mask": dict(need_weights=False, attn_mask="bool"),
    "float-mask-weights": dict(attn_mask="float"),
    "causal": dict(need_weights=False, attn_mask="causal", is_causal=True),
    "padding": dict(need_weights=False, key_padding_mask=True),
    "padding-and-mask-weights": dict(key_padding_mask=True, attn_mask="bool"),
}


def attention_arguments(call, batch_first, query, key):
    arguments = dict(call)
    if query.dim() == 2:
        (length, _), source, batch = query.shape, key.shape[0], 1
    elif batch_first:
        (batch, length, _), source = query.shape, key.shape[1]
    else:
        (length, batch, _), source = query.shape, key.shape[0]
    mask = arguments.get("attn_mask")
    if mask == "bool":
        arguments["attn_mask"] = torch.rand(length, source) > 0.6
        arguments["attn_mask"][:, 0] = False  # every query sees something
    elif mask == "float":
        arguments["attn_mask"] = torch.randn(length, source)
    elif mask == "causal":
        arguments["attn_mask"] = nn.Transformer.generate_square_subsequent_mask(length)
    if arguments.get("key_padding_mask"):
        padding = torch.zeros(batch, source, dtype=torch.bool)
        padding[:, -1] = True
        arguments["key_padding_mask"] = padding if query.dim() == 3 else padding[0]
    return arguments


@pytest.mark.parametrize("call", ATTENTION_CALLS)
@pytest.mark.parametrize("kind", ["self", "shared-key-value", "cross", "unbatched"])
@pytest.mark.parametrize("batch_first", [False, True], ids=["seq-first", "batch-first"])
def test_multihead_attention_equals_torchs_at_gamma_zero(kind, call, batch_first):
    dense = nn.MultiheadAttention(16, 4, batch_first=batch_first)
    layer = converted(dense, gamma=0.0)
    assert isinstance(layer, dropit.nn.MultiheadAttention)
    assert layer.state_dict().keys() == dense.state_dict().keys()
    causal = ATTENTION_CALLS[call].get("is_causal", False)
    query, key, value = attention_inputs(kind, batch_first, source=5 if causal else 6)
    arguments = attention_arguments(ATTENTION_CALLS[call], batch_first, query, key)
    output, weights = layer(query, key, value, **arguments)
    output_dense, weights_dense = dense(query, key, value, **arguments)
    torch.testing.assert_close(output, output_dense)
    if weights_dense is None:
        assert weights is None
    else:
        torch.testing.assert_close(weights, weights_dense)
    output.square().sum().backward()
    output_dense.square().sum().backward()
    for (name, p), q in zip(layer.named_parameters(), dense.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5, msg=name)


def test_multihead_attention_with_other_key_and_value_widths():
    dense = nn.MultiheadAttention(16, 2, kdim=5, vdim=7)
    layer = converted(dense, gamma=0.0)
    query, key, value = torch.randn(4, 2, 16), torch.randn(6, 2, 5), torch.randn(6, 2, 7)
    output, _ = layer(query, key, value, need_weights=False)
    output_dense, _ = dense(query, key, value, need_weights=False)
    torch.testing.assert_close(output, output_dense)
    output.sum().backward()
    output_dense.sum().backward()
    for (name, p), q in zip(layer.named_parameters(), dense.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5, msg=name)


def test_multihead_attention_at_gamma_09_keeps_the_input_gradient_exact():
    dense = nn.MultiheadAttention(16, 4, batch_first=True)
    layer = converted(dense, gamma=0.9, chunk_size=64)
    x = torch.randn(3, 10, 16, requires_grad=True)
    x_dense = x.detach().clone().requires_grad_()
    output, _ = layer(x, x, x, need_weights=False)
    output_dense, _ = dense(x_dense, x_dense, x_dense, need_weights=False)
    torch.testing.assert_close(output, output_dense)
    output.square().sum().backward()
    output_dense.square().sum().backward()
    torch.testing.assert_close(x.grad, x_dense.grad)
    difference = (layer.in_proj_weight.grad - dense.in_proj_weight.grad).norm()
    assert 0 < difference < dense.in_proj_weight.grad.norm()


def test_transformer_encoder_layer_converts_its_attention():
    dense = nn.TransformerEncoderLayer(16, 4, dim_feedforward=32, dropout=0.0, batch_first=True)
    model = copy.deepcopy(dense)
    report = dropit.convert(model, gamma=0.0, skip_first=False)
    assert {layer.name for layer in report.converted} >= {"self_attn", "linear1", "linear2"}
    x = torch.randn(2, 7, 16)
    padding = torch.zeros(2, 7, dtype=torch.bool)
    padding[1, -2:] = True
    model(x, src_key_padding_mask=padding).square().sum().backward()
    dense(x, src_key_padding_mask=padding).square().sum().backward()
    for (name, p), q in zip(model.named_parameters(), dense.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5, msg=name)


def test_layers_dropit_does_not_convert_are_listed_with_their_reasons():
    model = nn.Sequential(nn.Linear(4, 4), nn.ConvTranspose2d(2, 2, 3), nn.Bilinear(2, 2, 2),
                          nn.MultiheadAttention(8, 2, add_bias_kv=True))
    report = dropit.convert(model, skip_first=False)
    reasons = {layer.name: layer.reason for layer in report.skipped}
    assert "transposed convolution" in reasons["1"] and "bilinear" in reasons["2"]
    assert "add_bias_kv" in reasons["3"]
    assert "MultiheadAttention" in reasons["3.out_proj"]
    assert [layer.name for layer in report.converted] == ["0"]


class HeadFirst(nn.Module):
    """A model whose first registered layer is its last: skip_first must find the layer fed by
    the input, not the first one registered."""

    def __init__(self):
        super().__init__()
        self.head = nn.Linear(8, 3)
        self.embed = nn.Linear(5, 8)
        self.body = nn.Linear(8, 8)

    def forward(self, x):
        return self.head(torch.relu(self.body(torch.relu(self.embed(x)))))


def test_skip_first_finds_the_layer_fed_by_the_input_in_the_first_forward():
    model = HeadFirst()
    reference = copy.deepcopy(model)
    report = dropit.convert(model, gamma=0.9)
    assert {layer.name for layer in report.converted} == {"head", "embed", "body"}
    for _ in range(2):
        x = torch.randn(4, 5)
        model.zero_grad()
        reference.zero_grad()
        model(x).square().sum().backward()
        reference(x).square().sum().backward()
        # Decided in the first forward: from there on the embedding runs dense (exact gradient).
        assert [layer.name for layer in report.skipped] == ["embed"]
        assert "model's own input" in report.skipped[0].reason
        assert {layer.name for layer in report.converted} == {"head", "body"}
        torch.testing.assert_close(model.embed.weight.grad, reference.embed.weight.grad)
        assert not torch.allclose(model.body.weight.grad, reference.body.weight.grad)
    assert "dense (skip_first" in repr(model.embed)
    assert not model._forward_hooks and not model._forward_pre_hooks
    assert all("forward" not in m.__dict__ for m in model.modules())


def test_skip_first_with_an_example_input_puts_the_dense_layer_back():
    model = HeadFirst()
    report = dropit.convert(model, example_input=torch.randn(2, 5))
    assert type(model.embed) is nn.Linear and isinstance(model.head, dropit.nn.Linear)
    assert [layer.name for layer in report.skipped] == ["embed"]
    assert not model._forward_hooks and not model._forward_pre_hooks


def test_skip_first_probe_survives_a_failed_forward():
    model = HeadFirst()
    report = dropit.convert(model)

    def fail(module, args):
        raise RuntimeError("failed in the body")

    failing = model.body.register_forward_pre_hook(fail)
    with pytest.raises(RuntimeError, match="failed in the body"):
        model(torch.randn(4, 5))
    failing.remove()
    model(torch.randn(4, 5))
    assert model.embed._runs_dense and [layer.name for layer in report.skipped] == ["embed"]
    assert all("forward" not in m.__dict__ for m in model.modules())
    assert not model._forward_hooks and not model._forward_pre_hooks


class FusedAttention(nn.Module):
    """Attention as timm and Hugging Face write it: one qkv projection, torch's fused attention,
    heads merged by a view where the kernel's layout allows (``copy_heads``: by a copy)."""

    def __init__(self, width=32, heads=4, copy_heads=False):
        super().__init__()
        self.heads, self.copy_heads = heads, copy_heads
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)

    def forward(self, x):
        batch, tokens, width = x.shape
        qkv = self.qkv(x).reshape(batch, tokens, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        out = nn.functional.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2])
        out = out.transpose(1, 2)
        out = out.clone() if self.copy_heads else out
        return self.proj(out.reshape(batch, tokens, width))


@pytest.mark.parametrize("copy_heads", [False, True], ids=["view", "copy"])
def test_a_projection_of_the_fused_attention_output_saves_it_as_it_is(copy_heads):
    """The attention keeps its output for its own backward: a projection reading a view of it runs
    dense (exact gradient, no cache on top); reading a copy, it caches."""
    dense = FusedAttention(copy_heads=copy_heads)
    model = copy.deepcopy(dense)
    dropit.convert(model, gamma=0.9, skip_first=False, chunk_size=64)
    x = torch.randn(2, 10, 32)
    model(x).square().sum().backward()
    dense(x).square().sum().backward()
    assert not torch.allclose(model.qkv.weight.grad, dense.qkv.weight.grad)
    exact = torch.allclose(model.proj.weight.grad, dense.proj.weight.grad, rtol=1e-5, atol=1e-6)
    assert exact != copy_heads


def test_the_other_layers_under_cpu_autocast_step_as_dense_at_gamma_zero():
    dense = Sequence()
    model = copy.deepcopy(dense)
    dropit.convert(model, gamma=0.0, skip_first=False)
    x, target = torch.randn(3, 2, 6, 4, 4), torch.randint(0, 10, (3,))
    for m in (dense, model):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            nn.functional.cross_entropy(m(x), target).backward()
    for (name, p), q in zip(model.named_parameters(), dense.parameters()):
        assert p.grad.dtype == torch.float32
        torch.testing.assert_close(p.grad, q.grad, rtol=2e-2, atol=1e-3, msg=name)
