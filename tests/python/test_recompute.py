"""A linear or convolution layer reading a converted producer's output (LayerNorm, GELU, SiLU,
BatchNorm2d, through a dropit ReLU or not) caches nothing and recomputes that output in backward
from the input the producer keeps anyway: its weight gradient is the dense one (after BatchNorm in
training, within rounding), whatever gamma is, and only the producers' inputs stay held."""

import copy

import pytest
import torch
from torch import nn

import dropit
from cases import ProducerStack
from savings import held_after_forward_and_step_peak


def held_after_forward(model, x):
    return held_after_forward_and_step_peak(model, x)[0]


def gradients(model, x):
    model.zero_grad(set_to_none=True)
    model(x).square().sum().backward()
    return {name: p.grad for name, p in model.named_parameters()}


def test_recomputed_layers_hold_only_the_producers_inputs_and_have_dense_gradients():
    dense = ProducerStack()
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
    class Scaled(ProducerStack):
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
    reference = ProducerStack()
    dropit.convert(reference, gamma=0.9, chunk_size=256, recompute=False, skip_first=False)
    model = ProducerStack()
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


def test_dropout_converts_and_drops_as_torchs():
    """convert (with recompute) swaps nn.Dropout for dropit's, which is torch's where it drops
    and returns its input itself where it drops nothing (what a compiled layer behind a dropout
    of 0 relies on: test_compile's transformer block)."""
    model = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.3), nn.Dropout(0.0))
    report = dropit.convert(model)
    assert [type(m) for m in model[1:]] == [dropit.nn.Dropout] * 2
    assert [layer.kind for layer in report.converted].count("Dropout") == 2
    again = dropit.convert(model)
    assert {layer.name: layer.reason for layer in again.skipped if layer.kind == "Dropout"} == {
        "1": "already a dropit layer", "2": "already a dropit layer"}
    plain = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.3))
    dropit.convert(plain, recompute=False)
    assert type(plain[1]) is nn.Dropout
    x = torch.randn(64, 4, requires_grad=True)
    torch.manual_seed(3)
    actual = model[1](x)
    torch.manual_seed(3)
    expected = nn.functional.dropout(x, 0.3, training=True)
    assert torch.equal(actual, expected) and (actual == 0).any()
    assert model[2](x) is x
    model.eval()
    assert model[1](x) is x


def conv_stack():
    """conv -> BatchNorm -> ReLU -> conv -> BatchNorm -> ReLU -> 1x1 conv, as in a ResNet."""
    torch.manual_seed(1)
    stack = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
                          nn.Conv2d(16, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16),
                          nn.ReLU(), nn.Conv2d(16, 8, 1))
    with torch.no_grad():  # scale and shift away from 1 and 0: the recomputation must apply them
        for norm in (stack[1], stack[4]):
            norm.weight.uniform_(0.5, 1.5)
            norm.bias.normal_(0.0, 0.5)
    return stack


@pytest.mark.parametrize("memory_format", [torch.contiguous_format, torch.channels_last])
def test_convolutions_after_batch_norm_and_relu_recompute_their_inputs(memory_format):
    dense = conv_stack()
    model = copy.deepcopy(dense)
    x = torch.randn(8, 3, 24, 24).contiguous(memory_format=memory_format)
    report = dropit.convert(model, gamma=0.9, example_input=x)
    caches = {layer.name: (layer.reuses_input, layer.cache_bytes) for layer in report.converted
              if layer.cache_bytes is not None}
    assert caches == {"3": (True, 0), "6": (True, 0)}  # "0" reads the model's input: dense
    assert isinstance(model[1], dropit.nn.BatchNorm2d) and isinstance(model[2], dropit.nn.ReLU)
    for _ in range(2):  # the first step also allocates the gradients
        dense_held, held = held_after_forward(dense, x), held_after_forward(model, x)
    # Held: both BatchNorms' inputs (and per-channel statistics), the ReLUs' 1-bit masks; dense
    # also holds both ReLU outputs.
    activation = 4 * 8 * 16 * 24 * 24
    assert 2 * activation <= held <= 2 * activation + 2 * activation // 32 + 4096
    assert dense_held >= 4 * activation
    actual, expected = gradients(model, x), gradients(dense, x)
    for name in expected:
        if name in ("3.weight", "6.weight"):
            # Their inputs recomputed from the batch's statistics in one affine pass, which torch's
            # kernel rounds in its own order: within rounding of torch's.
            torch.testing.assert_close(actual[name], expected[name], rtol=0,
                                       atol=1e-5 * expected[name].abs().max().item())
        else:  # torch's kernels on the same tensors: bitwise
            assert torch.equal(actual[name], expected[name]), name
    for (name, a), b in zip(model.named_buffers(), dense.buffers()):
        assert torch.equal(a, b), name  # running statistics move as torch's do


def test_layers_on_producer_outputs_recompute_in_cpp_unless_through_layers():
    # The LibTorch adapters' C++ functions; through layers, the Python ones (which chain layers).
    x = torch.randn(4, 3, 12, 12)
    for through_layers, node in ((False, "dropit::RecomputingConv2dBackward"),
                                 (True, "RecomputedInputConvolutionBackward")):
        model = conv_stack()
        dropit.convert(model, gamma=0.9, recompute_layers=through_layers, example_input=x)
        assert node in model[:4](x).grad_fn.name()  # conv, BatchNorm, ReLU, conv
    rows = torch.randn(8, 64)
    for through_layers, node in ((False, "dropit::RecomputingLinearBackward"),
                                 (True, "RecomputedInputLinearBackward")):
        model = ProducerStack()
        dropit.convert(model, gamma=0.9, recompute_layers=through_layers)
        after_norm = model.b(model.norm(model.a(rows)))
        after_gelu = model.c(model.act(after_norm))
        assert node in after_norm.grad_fn.name() and node in after_gelu.grad_fn.name()


def test_recomputation_after_a_batch_norm_in_training_does_not_run_batch_norm_again(monkeypatch):
    model = conv_stack()
    x = torch.randn(4, 3, 12, 12)
    dropit.convert(model, gamma=0.9, example_input=x)
    loss = model(x).square().sum()

    def batch_norm_again(*args, **kwargs):
        raise AssertionError("backward ran batch norm again")

    # One affine pass from the statistics torch's kernel saved: no reduction over the batch.
    monkeypatch.setattr(torch.nn.functional, "batch_norm", batch_norm_again)
    loss.backward()
    assert model[3].weight.grad is not None and model[6].weight.grad is not None


def test_recomputation_after_an_affine_free_batch_norm_without_running_statistics():
    torch.manual_seed(13)
    dense = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=False),
                          nn.BatchNorm2d(8, affine=False, track_running_stats=False), nn.ReLU(),
                          nn.Conv2d(8, 4, 3, padding=1))
    model = copy.deepcopy(dense)
    x = torch.randn(4, 3, 10, 10)
    report = dropit.convert(model, gamma=0.9, example_input=x)
    assert [(layer.name, layer.cache_bytes) for layer in report.converted
            if layer.cache_bytes is not None] == [("3", 0)]
    actual, expected = gradients(model, x), gradients(dense, x)
    torch.testing.assert_close(actual["3.weight"], expected["3.weight"], rtol=0,
                               atol=1e-5 * expected["3.weight"].abs().max().item())
    for name in ("0.weight", "3.bias"):
        assert torch.equal(actual[name], expected[name]), name


def test_batch_norm_inside_a_non_reentrant_checkpoint_runs_once_per_forward():
    # Saved-tensor hooks are in force there: the statistics are not read off the autograd node
    # (which would run the checkpointed region again), and the recomputation runs batch norm.
    dense = conv_stack()
    model = copy.deepcopy(dense)
    x = torch.randn(4, 3, 12, 12)
    dropit.convert(model, gamma=0.9, example_input=x)
    calls = []
    model[1].register_forward_hook(lambda *args: calls.append(1))
    y = torch.utils.checkpoint.checkpoint(model, x, use_reentrant=False)
    assert len(calls) == 1 and int(model[1].num_batches_tracked) == 1
    y.square().sum().backward()
    expected = gradients(dense, x)
    for name, parameter in model.named_parameters():
        torch.testing.assert_close(parameter.grad, expected[name], rtol=0,
                                   atol=1e-5 * expected[name].abs().max().item())


def test_a_convolution_after_a_frozen_batch_norm_recomputes_with_its_running_statistics():
    dense = conv_stack()
    for _ in range(3):  # running statistics away from their initial values
        dense(torch.randn(8, 3, 12, 12))
    dense[1].eval()
    dense[4].eval()
    model = copy.deepcopy(dense)
    x = torch.randn(4, 3, 12, 12)
    dropit.convert(model, gamma=0.9, example_input=x)  # the first convolution stays dense
    assert not model[1].training and not model[4].training and model[3].training
    actual, expected = gradients(model, x), gradients(dense, x)
    for name in expected:
        assert torch.equal(actual[name], expected[name]), name


def test_a_convolution_caches_without_the_1_bit_relu_in_between():
    model = conv_stack()
    report = dropit.convert(model, gamma=0.9, relu=False, example_input=torch.randn(2, 3, 8, 8))
    assert all(not layer.reuses_input for layer in report.converted)
    assert type(model[2]) is nn.ReLU


def test_recompute_layers_runs_the_middle_linear_layer_once_in_backward(monkeypatch):
    # The last linear layer recomputes the GELU's output through the one before it; the GELU takes
    # the input left on the way instead of running that layer again.
    model = ProducerStack()
    dropit.convert(model, gamma=0.9, recompute_layers=True)
    y = model(torch.randn(32, 64))
    calls = []
    linear = torch.nn.functional.linear
    monkeypatch.setattr(torch.nn.functional, "linear",
                        lambda *args, **kwargs: calls.append(1) or linear(*args, **kwargs))
    y.square().sum().backward()
    assert len(calls) == 1


def test_recompute_layers_frees_the_gelu_input_with_dense_gradients():
    dense = ProducerStack()
    model, default = copy.deepcopy(dense), copy.deepcopy(dense)
    x = torch.randn(256, 64)
    dropit.convert(model, gamma=0.9, recompute_layers=True)
    dropit.convert(default, gamma=0.9)
    for _ in range(2):  # the first step also allocates the gradients
        held, default_held = held_after_forward(model, x), held_after_forward(default, x)
    # Held: the LayerNorm's input and statistics only. The last linear layer recomputes the GELU's
    # output through the linear layer before it, and the GELU its input the same way; without
    # recompute_layers the GELU keeps its input.
    width, rows = 256, 256
    assert 4 * rows * width <= held <= 4 * rows * width + 4 * 2 * rows + 4096
    assert default_held >= 4 * rows * 3 * width
    actual, expected = gradients(model, x), gradients(dense, x)
    for name in expected:  # the same kernels on the same tensors: bitwise
        assert torch.equal(actual[name], expected[name]), name


@pytest.mark.parametrize("training", [True, False])
def test_recompute_layers_frees_the_input_of_a_batch_norm_after_a_recomputing_convolution(
        training):
    dense = conv_stack()
    model = copy.deepcopy(dense)
    for net in (dense, model):
        for norm in (net[1], net[4]):
            norm.train(training)
    x = torch.randn(8, 3, 24, 24)
    dropit.convert(model, gamma=0.9, recompute_layers=True)
    for _ in range(2):  # the first step also allocates the gradients
        held = held_after_forward(model, x)
        held_after_forward(dense, x)  # the same steps: running statistics stay comparable
    # Held: the first BatchNorm's input (and per-channel statistics), the ReLUs' 1-bit masks; not
    # the second BatchNorm's input, which the convolution before it gives again.
    activation = 4 * 8 * 16 * 24 * 24
    assert activation <= held <= activation + 2 * activation // 32 + 4096
    actual, expected = gradients(model, x), gradients(dense, x)
    for name in expected:
        # In training, the second BatchNorm's input is recomputed from the first's statistics in
        # one affine pass: every gradient upstream of it within rounding of torch's.
        torch.testing.assert_close(actual[name], expected[name], rtol=0,
                                   atol=1e-5 * expected[name].abs().max().item())
        if not training:  # the running statistics: the same kernels on the same tensors
            assert torch.equal(actual[name], expected[name]), name
    for (name, a), b in zip(model.named_buffers(), dense.buffers()):
        assert torch.equal(a, b), name  # running statistics move as torch's do


def test_recompute_layers_runs_one_layer_again_at_most():
    # LayerNorm -> linear -> LayerNorm -> linear -> SiLU -> linear: the second LayerNorm keeps
    # nothing (its input is the first linear layer's forward again); the second linear layer
    # recomputes its input through that layer, so its own output is not offered again and the SiLU
    # keeps its input: backward never runs two layers' forwards to recompute one tensor.
    torch.manual_seed(4)
    dense = nn.Sequential(nn.LayerNorm(32), nn.Linear(32, 48), nn.LayerNorm(48),
                          nn.Linear(48, 48), nn.SiLU(), nn.Linear(48, 16))
    model = copy.deepcopy(dense)
    dropit.convert(model, gamma=0.9, skip_first=False, recompute_layers=True)
    x = torch.randn(4, 8, 32)
    for _ in range(2):  # the first step also allocates the gradients
        held = held_after_forward(model, x)
    silu_input, statistics = 4 * 4 * 8 * 48, 4 * 4 * 8 * 4
    assert silu_input <= held <= silu_input + statistics + 4096
    actual, expected = gradients(model, x), gradients(dense, x)
    for name in expected:  # the same kernels on the same tensors: bitwise
        assert torch.equal(actual[name], expected[name]), name
