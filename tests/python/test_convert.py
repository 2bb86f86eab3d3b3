"""dropit.convert on real model trees: torchvision's ResNet-18 and a ViT, and hand-built trees with
attributes, Sequential, ModuleList, ModuleDict and shared modules."""

import copy
import io
import math

import pytest
import torch
from torch import nn

import dropit
from cache_sizes import chunked_min_k_bytes

torchvision = pytest.importorskip("torchvision", reason="torchvision is not installed")


def small_vit():
    return torchvision.models.VisionTransformer(image_size=32, patch_size=8, num_layers=2,
                                                num_heads=2, hidden_dim=32, mlp_dim=64,
                                                num_classes=10)


def layers_of(model, types):
    return {name for name, m in model.named_modules() if type(m) in types}


LINEAR_CONV = (nn.Linear, nn.Conv2d, nn.modules.linear.NonDynamicallyQuantizableLinear)


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
            assert layer.cache_bytes == chunked_min_k_bytes(numel, 0.9, 16384, 4), layer.name
    converted = {layer.name for layer in report.converted}
    assert any(isinstance(m, (dropit.nn.Linear, dropit.nn.Conv2d))
               for m in model.modules())
    for name, module in model.named_modules():
        if name in converted and name in candidates:
            assert isinstance(module, (dropit.nn.Linear, dropit.nn.Conv2d)), name

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


def test_vit_attention_out_proj_is_left_with_its_reason():
    model = small_vit()
    report = dropit.convert(model)
    reasons = {layer.name: layer.reason for layer in report.skipped}
    out_proj = [name for name in reasons if name.endswith("self_attention.out_proj")]
    assert out_proj and all("MultiheadAttention" in reasons[n] for n in out_proj)
    assert "conv_proj" in reasons and "first layer" in reasons["conv_proj"]


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
    report = dropit.convert(model, exclude=[r"heads\.b"])
    assert isinstance(model.stem, nn.Linear) and not isinstance(model.stem, dropit.nn.Linear)
    assert isinstance(model.blocks[0][0], dropit.nn.Linear)
    assert isinstance(model.blocks[0][1], dropit.nn.ReLU)
    assert isinstance(model.act, dropit.nn.ReLU)
    assert isinstance(model.heads["a"], dropit.nn.Linear)
    assert type(model.heads["b"]) is nn.Conv2d
    # A module held in two places is replaced by one dropit module in both.
    assert isinstance(model.shared, dropit.nn.Linear) and model.blocks[1] is model.shared
    skipped = {layer.name: layer.reason for layer in report.skipped}
    assert "exclude" in skipped["heads.b"] and "first" in skipped["stem"]
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
    padded, _ = model[1]._padded(x)
    cache = dropit.functional.compress(padded, gamma=0.5, chunk_size=64)
    assert cache.nbytes - sizes["1"].cache_bytes in range(0, 4)  # positions padded to 32 bits
