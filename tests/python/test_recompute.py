"""A linear layer reading a converted producer's output (LayerNorm, GELU, SiLU) caches nothing and
recomputes that output in backward from the input the producer keeps anyway: its weight gradient
is the dense one, whatever gamma is, and only the producers' inputs stay held."""

import copy

import pytest
import torch
from torch import nn

import dropit


class Stack(nn.Module):
    """linear -> LayerNorm -> linear -> GELU -> linear."""

    def __init__(self, width=256):
        super().__init__()
        torch.manual_seed(0)
        self.a, self.norm = nn.Linear(64, width), nn.LayerNorm(width)
        self.b, self.act, self.c = nn.Linear(width, 2 * width), nn.GELU(), nn.Linear(2 * width, 64)

    def forward(self, x):
        return self.c(self.act(self.b(self.norm(self.a(x)))))


def held_after_forward(model, x):
    with dropit.memory.measure("cpu") as forward:
        y = model(x)
    y.square().sum().backward()
    return forward.retained_bytes - y.numel() * y.element_size()


def gradients(model, x):
    model.zero_grad(set_to_none=True)
    model(x).square().sum().backward()
    return {name: p.grad for name, p in model.named_parameters()}


def test_recomputed_layers_hold_only_the_producers_inputs_and_have_dense_gradients():
    dense = Stack()
    model = copy.deepcopy(dense)
    x = torch.randn(256, 64)
    report = dropit.convert(model, gamma=0.9, example_input=x)
    reuses = {layer.name: layer.reuses_input for layer in report.converted if layer.cache_bytes
              is not None}
    assert reuses == {"b": True, "c": True}  # "a" reads the model's input: left dense
    assert {layer.name: layer.cache_bytes for layer in report.converted
            if layer.cache_bytes is not None} == {"b": 0, "c": 0}
    for _ in range(2):  # the first step also allocates the gradients
        dense_held, held = held_after_forward(dense, x), held_after_forward(model, x)
    # Held: the LayerNorm's input and statistics, the GELU's input; dense also holds both of
    # their outputs.
    width, rows = 256, 256
    producer_inputs = 4 * rows * (width + 2 * width)
    assert held <= producer_inputs + 4 * 2 * rows + 4096
    assert held / dense_held <= 0.56
    actual, expected = gradients(model, x), gradients(dense, x)
    for name in expected:  # the same kernels on the same tensors: bitwise
        assert torch.equal(actual[name], expected[name]), name


def test_a_producer_output_modified_in_place_is_cached_instead():
    class Scaled(Stack):
        def forward(self, x):
            h = self.norm(self.a(x))
            h.mul_(2.0)
            return self.c(self.act(self.b(h)))

    x = torch.randn(64, 64)
    dense = Scaled()
    cached = copy.deepcopy(dense)
    dropit.convert(cached, gamma=0.9, chunk_size=256, recompute=False, skip_first=False)
    model = copy.deepcopy(dense)
    dropit.convert(model, gamma=0.9, chunk_size=256, skip_first=False)
    actual = gradients(model, x)
    # "b" reads the modified output: it caches, as without recomputation; "c" still recomputes.
    assert torch.equal(actual["b.weight"], gradients(cached, x)["b.weight"])
    assert torch.equal(actual["c.weight"], gradients(dense, x)["c.weight"])
    assert not torch.equal(actual["b.weight"], gradients(dense, x)["b.weight"])


def test_under_autocast_the_layer_caches():
    x = torch.randn(64, 64)
    reference = Stack()
    dropit.convert(reference, gamma=0.9, chunk_size=256, recompute=False, skip_first=False)
    model = Stack()
    dropit.convert(model, gamma=0.9, chunk_size=256, skip_first=False)
    for m in (model, reference):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            m(x).float().square().sum().backward()
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=0, atol=0, msg=name)


@pytest.mark.parametrize("batch_first", [False, True])
def test_self_attention_after_a_layer_norm_recomputes_its_input(batch_first):
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.norm = nn.LayerNorm(32)
            self.attention = nn.MultiheadAttention(32, 4, batch_first=batch_first)

        def forward(self, x):
            h = self.norm(x)
            return self.attention(h, h, h, need_weights=False)[0]

    dense = Block()
    model = copy.deepcopy(dense)
    x = torch.randn(3, 10, 32)
    report = dropit.convert(model, gamma=0.9, example_input=x)
    attention = next(layer for layer in report.converted if layer.kind == "MultiheadAttention")
    assert attention.reuses_input and attention.cache_bytes == 0
    actual, expected = gradients(model, x), gradients(dense, x)
    for name in expected:
        torch.testing.assert_close(actual[name], expected[name], rtol=1e-5, atol=1e-6, msg=name)


def test_recompute_false_and_inplace_producers_stay_torchs():
    model = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4), nn.SiLU(inplace=True), nn.GELU())
    dropit.convert(model, recompute=False)
    assert [type(m) for m in model[1:]] == [nn.LayerNorm, nn.SiLU, nn.GELU]
    model = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4), nn.SiLU(inplace=True), nn.GELU())
    report = dropit.convert(model)
    assert isinstance(model[1], dropit.nn.LayerNorm) and type(model[2]) is nn.SiLU
    assert isinstance(model[3], dropit.nn.GELU)
    assert model.state_dict().keys() == {"0.weight", "0.bias", "1.weight", "1.bias"}
    assert {layer.kind for layer in report.converted} >= {"LayerNorm", "GELU"}
