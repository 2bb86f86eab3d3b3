"""A converted model under torch.compile(fullgraph=True): no graph break, dropit's operators in the
graphs the partitioner sees, gradients equal to dense at gamma 0 and to eager dropit at gamma 0.9;
and selective activation checkpointing that names dropit's operators."""

import copy
import functools

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import (CheckpointPolicy, checkpoint,
                                    create_selective_checkpoint_contexts)

import dropit
from cases import ProducerStack, Sequence
from savings import held_after_forward_and_step_peak

ops = torch.ops.dropit


def small_cnn():
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
        nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(2), nn.Flatten(),
        nn.Linear(32, 10))


def gradients(model, x, target):
    for p in model.parameters():
        p.grad = None
    nn.functional.cross_entropy(model(x), target).backward()
    return [p.grad.clone() for p in model.parameters()]


def batch(device, channels_last=False):
    x = torch.randn(4, 3, 12, 12, device=device)
    if channels_last:
        x = x.to(memory_format=torch.channels_last)
    return x, torch.randint(0, 10, (4,), device=device)


class GraphRecorder:
    """A torch.compile backend that keeps dynamo's graph and AOTAutograd's forward and backward
    graphs, then runs them as AOTAutograd compiled them (no code generation: fast).
    ``inductor_partitioner``: split them with inductor's partitioner (which also merges identical
    calls), not the default one."""

    def __init__(self, inductor_partitioner=False):
        from torch._dynamo.backends.common import aot_autograd
        from torch._functorch.partitioners import (default_partition,
                                                   min_cut_rematerialization_partition)
        self.graphs = {"dynamo": [], "forward": [], "backward": []}

        def keep(kind):
            def compiler(gm, example_inputs):
                self.graphs[kind].append(gm)
                return gm.forward
            return compiler

        self._aot = aot_autograd(
            fw_compiler=keep("forward"), bw_compiler=keep("backward"),
            partition_fn=(min_cut_rematerialization_partition if inductor_partitioner
                          else default_partition))

    def __call__(self, gm, example_inputs):
        self.graphs["dynamo"].append(gm)
        return self._aot(gm, example_inputs)

    def targets(self, kind):
        """The operators the graphs of `kind` call, named as in "dropit.compress"."""
        return {str(node.target).removesuffix(".default") for gm in self.graphs[kind]
                for node in gm.graph.nodes if node.op == "call_function"}


def test_the_partitioner_sees_dropit_operators():
    model = small_cnn()
    dropit.convert(model, gamma=0.9, skip_first=False)
    recorder = GraphRecorder()
    compiled = torch.compile(model, backend=recorder, fullgraph=True)
    x, target = batch("cpu")
    gradients(compiled, x, target)
    assert len(recorder.graphs["dynamo"]) == 1  # one graph: no break
    assert {"dropit.conv2d", "dropit.linear", "dropit.relu"} <= recorder.targets("dynamo")
    forward, backward = recorder.targets("forward"), recorder.targets("backward")
    assert {"dropit.compress", "dropit.relu_with_mask"} <= forward
    assert {"dropit.relu_backward", "dropit.linear_weight_grad"} <= backward
    assert backward & {"dropit.conv2d_weight_grad", "dropit.densify"}


@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "channels_last"])
def test_compiled_with_inductor_gamma_zero_equals_dense(channels_last):
    dense = small_cnn()
    model = copy.deepcopy(dense)
    dropit.convert(model, gamma=0.0, skip_first=False)
    if channels_last:
        dense, model = dense.to(memory_format=torch.channels_last), model.to(
            memory_format=torch.channels_last)
    compiled = torch.compile(model, backend="inductor", fullgraph=True)
    x, target = batch("cpu", channels_last)
    for _ in range(2):  # the second step runs the cached graph
        actual, expected = gradients(compiled, x, target), gradients(dense, x, target)
        for a, e in zip(actual, expected):
            torch.testing.assert_close(a, e, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("policy", [dict(policy="chunked_min_k", chunk_size=256),
                                    dict(policy="random", chunk_size=256, seed=5)],
                         ids=["chunked_min_k", "random"])
def test_compiled_gamma_09_equals_eager_dropit(policy):
    eager = small_cnn()
    # recompute=False: eager recomputes a convolution's input after BatchNorm -> ReLU, which
    # torch.compile leaves to its partitioner; here both cache every layer.
    dropit.convert(eager, gamma=0.9, skip_first=False, recompute=False, **policy)
    model = copy.deepcopy(eager)
    recorder = GraphRecorder()
    compiled = torch.compile(model, backend=recorder, fullgraph=True)
    for step in range(4):  # random selection draws afresh each step, in both
        x, target = batch("cpu")
        torch.manual_seed(100 + step)
        actual = gradients(compiled, x, target)
        torch.manual_seed(100 + step)
        expected = gradients(eager, x, target)
        for a, e in zip(actual, expected):
            torch.testing.assert_close(a, e, rtol=1e-4, atol=1e-5)
    assert len(recorder.graphs["dynamo"]) == 1  # compiled once, not every step


def dynamo_calls(recorder, target) -> int:
    """How many times dynamo's graphs call `target` (an operator or a function)."""
    return sum(node.op == "call_function" and node.target is target
               for gm in recorder.graphs["dynamo"] for node in gm.graph.nodes)


@pytest.mark.parametrize("gamma", [0.0, 0.9])
def test_compiled_layers_after_producers_leave_their_input_to_the_compiler(gamma):
    """A layer reading a producer's output (BatchNorm -> ReLU -> conv) runs torch's convolution
    under torch.compile, its input kept or recomputed by the partitioner, and the ReLU between is
    torch's (fused with BatchNorm); the rest still cache. Gradients equal eager dropit's, which
    recomputes that input exactly: at gamma 0 and 0.9 alike."""
    eager = small_cnn()
    dropit.convert(eager, gamma=gamma, chunk_size=256, skip_first=False)
    model = copy.deepcopy(eager)
    recorder = GraphRecorder()
    compiled = torch.compile(model, backend=recorder, fullgraph=True)
    for _ in range(2):
        x, target = batch("cpu")
        actual, expected = gradients(compiled, x, target), gradients(eager, x, target)
        for a, e in zip(actual, expected):
            torch.testing.assert_close(a, e, rtol=1e-4, atol=1e-5)
    assert len(recorder.graphs["dynamo"]) == 1
    # conv (caches the model's input) -> BN -> ReLU (torch's) -> conv (torch's) -> ReLU (mask)
    # -> pool -> linear (caches).
    assert dynamo_calls(recorder, ops.conv2d.default) == 1
    assert dynamo_calls(recorder, torch.conv2d) == 1
    assert dynamo_calls(recorder, ops.relu.default) == 1
    assert dynamo_calls(recorder, ops.linear.default) == 1
    forward = [node.target for gm in recorder.graphs["forward"] for node in gm.graph.nodes]
    assert forward.count(ops.compress.default) == 2


class PreNormBlock(nn.Module):
    """x + attention(LayerNorm(x)), then x + fc2(Dropout(GELU(fc1(LayerNorm(x))))) (dropout 0,
    as torchvision's ViT has it), then a linear layer on the residual stream."""

    def __init__(self, width=16):
        super().__init__()
        torch.manual_seed(0)
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.attention = nn.MultiheadAttention(width, 4, batch_first=True)
        self.fc1, self.act, self.fc2 = nn.Linear(width, 2 * width), nn.GELU(), nn.Linear(
            2 * width, width)
        self.drop = nn.Dropout(0.0)
        self.head = nn.Linear(width, 10)

    def forward(self, x):
        h = self.norm1(x)
        x = x + self.attention(h, h, h, need_weights=False)[0]
        x = x + self.fc2(self.drop(self.act(self.fc1(self.norm2(x)))))
        return self.head(x).mean(dim=1)


def test_compiled_transformer_block_caches_only_the_residual_stream():
    """Under torch.compile the projections reading LayerNorm's and GELU's outputs are torch's
    linear layers (the in-projection included; the MLP's second through a dropout of 0, which a
    traced dropout would hide) and the output projection reads what the fused
    attention keeps: only the head, on the residual stream, caches. Gradients equal eager dropit's
    (which recomputes those inputs)."""
    eager = PreNormBlock()
    dropit.convert(eager, gamma=0.9, chunk_size=64, skip_first=False)
    model = copy.deepcopy(eager)
    recorder = GraphRecorder()
    compiled = torch.compile(model, backend=recorder, fullgraph=True)
    x, target = torch.randn(3, 5, 16), torch.randint(0, 10, (3,))
    for _ in range(2):
        actual, expected = gradients(compiled, x, target), gradients(eager, x, target)
        for a, e in zip(actual, expected):
            torch.testing.assert_close(a, e, rtol=1e-4, atol=1e-5)
    assert len(recorder.graphs["dynamo"]) == 1
    assert dynamo_calls(recorder, ops.linear.default) == 1  # the head
    forward = [node.target for gm in recorder.graphs["forward"] for node in gm.graph.nodes]
    assert forward.count(ops.compress.default) == 1


def test_compiled_producers_are_recomputed_as_eager_dropit_recomputes_them():
    """Under torch.compile (inductor, default memory budget, which keeps what eager torch keeps)
    the outputs of LayerNorm and GELU are computed again in backward, as eager dropit does: only
    the producers' inputs stay held, and the gradients are dense."""
    dense = ProducerStack()
    model = copy.deepcopy(dense)
    x = torch.randn(256, 64)
    dropit.convert(model, gamma=0.9, example_input=x)
    compiled = torch.compile(model, backend="inductor", fullgraph=True)
    compiled_dense = torch.compile(copy.deepcopy(dense), backend="inductor", fullgraph=True)
    for _ in range(2):  # the first step also allocates the gradients
        held = held_after_forward_and_step_peak(compiled, x)[0]
        dense_held = held_after_forward_and_step_peak(compiled_dense, x)[0]
    width, rows = 256, 256
    producer_inputs = 4 * rows * (width + 2 * width)  # the LayerNorm's and the GELU's
    assert held <= producer_inputs + 4 * 2 * rows + 4096
    assert held / dense_held <= 0.56
    target = torch.randint(0, 64, (256,))
    for a, e in zip(gradients(compiled, x, target), gradients(dense, x, target)):
        torch.testing.assert_close(a, e, rtol=1e-4, atol=1e-5)


class SharedInput(nn.Module):
    """Two convolutions reading one input, as a residual block's first convolution and its
    shortcut do."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.body, self.shortcut = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(3, 8, 1)
        self.head = nn.Linear(8, 10)

    def forward(self, x):
        return self.head((self.body(x) + self.shortcut(x)).mean(dim=(2, 3)))


class Checkpointed(nn.Module):
    """``inner`` under torch.utils.checkpoint (non-reentrant), as users checkpoint a block."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        return checkpoint(self.inner, x, use_reentrant=False)


@pytest.mark.parametrize("make, example", [
    (PreNormBlock, lambda: (torch.randn(3, 5, 16), torch.randint(0, 10, (3,)))),
    (small_cnn, lambda: batch("cpu")),
], ids=["transformer_block", "cnn"])
def test_compiled_checkpointed_models_equal_eager_dropit(make, example):
    """A converted block checkpointed by the user compiles whole (the producers' own checkpoints
    nest in it) with eager dropit's gradients."""
    eager = make()
    dropit.convert(eager, gamma=0.9, chunk_size=64, skip_first=False)
    compiled = torch.compile(Checkpointed(copy.deepcopy(eager)), backend="inductor",
                             fullgraph=True)
    x, target = example()
    for _ in range(2):
        actual, expected = gradients(compiled, x, target), gradients(eager, x, target)
        for a, e in zip(actual, expected):
            torch.testing.assert_close(a, e, rtol=1e-4, atol=1e-5)


def test_compiled_layers_reading_one_input_keep_one_cache():
    """Two layers with a deterministic selection caching one input make the same compress call,
    which the compiler computes and keeps once; gradients equal eager dropit's."""
    eager = SharedInput()
    dropit.convert(eager, gamma=0.9, chunk_size=64, skip_first=False)
    model = copy.deepcopy(eager)
    recorder = GraphRecorder(inductor_partitioner=True)
    compiled = torch.compile(model, backend=recorder, fullgraph=True)
    x, target = batch("cpu")
    for a, e in zip(gradients(compiled, x, target), gradients(eager, x, target)):
        torch.testing.assert_close(a, e, rtol=1e-4, atol=1e-5)
    assert dynamo_calls(recorder, ops.conv2d.default) == 2
    forward = [node.target for gm in recorder.graphs["forward"] for node in gm.graph.nodes]
    assert forward.count(ops.compress.default) == 2  # the convolutions' input, the head's


@pytest.mark.parametrize("gamma", [0.0, 0.9])
def test_compiled_sequence_layers_equal_eager(gamma):
    """At gamma 0 equal to dense, at 0.9 to eager dropit; the first layer (skip_first, decided in
    the first eager forward) is left dense in both. (The eager recomputation of a LayerNorm's
    output is not traced: the compiler's partitioner does its own, so it is off here.)"""
    dense = Sequence()
    eager = copy.deepcopy(dense)
    report = dropit.convert(eager, gamma=gamma, chunk_size=256, recompute=False)
    x, target = torch.randn(3, 2, 6, 4, 4), torch.randint(0, 10, (3,))
    expected = gradients(dense if gamma == 0 else eager, x, target)
    gradients(eager, x, target)  # the first eager forward decided skip_first
    assert [layer.name for layer in report.skipped] == ["video"]
    model = copy.deepcopy(eager)
    recorder = GraphRecorder()
    compiled = torch.compile(model, backend=recorder, fullgraph=True)
    for _ in range(2):
        actual = gradients(compiled, x, target)
        for a, e in zip(actual, expected):
            torch.testing.assert_close(a, e, rtol=1e-4, atol=1e-5)
    assert len(recorder.graphs["dynamo"]) == 1
    assert {"dropit.conv2d", "dropit.linear"} <= recorder.targets("dynamo")


def test_compiled_conv3d_is_one_dropit_operator():
    dense = nn.Sequential(nn.Conv3d(2, 3, 3, padding=1), nn.Flatten(), nn.Linear(3 * 64, 10))
    model = copy.deepcopy(dense)
    dropit.convert(model, gamma=0.0, skip_first=False)
    recorder = GraphRecorder()
    compiled = torch.compile(model, backend=recorder, fullgraph=True)
    x, target = torch.randn(2, 2, 4, 4, 4), torch.randint(0, 10, (2,))
    for a, e in zip(gradients(compiled, x, target), gradients(dense, x, target)):
        torch.testing.assert_close(a, e, rtol=1e-4, atol=1e-5)
    assert "dropit.convolution" in recorder.targets("dynamo")
    assert "dropit.densify" in recorder.targets("backward")


@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="no CUDA device: CUDA graphs (mode='reduce-overhead') are not tested")
def test_cuda_graphs_gamma_zero_equals_dense():
    dense = small_cnn().cuda()
    model = copy.deepcopy(dense)
    dropit.convert(model, gamma=0.0, skip_first=False)
    compiled = torch.compile(model, mode="reduce-overhead", fullgraph=True)
    for _ in range(3):  # warm-up, record, replay
        x, target = batch("cuda")
        actual, expected = gradients(compiled, x, target), gradients(dense, x, target)
        for a, e in zip(actual, expected):
            torch.testing.assert_close(a, e, rtol=1e-4, atol=1e-5)


def keep_dropit_caches(ctx, op, *args, **kwargs):
    """A selective-checkpointing policy: save dropit's compact caches, recompute everything else."""
    if op in (ops.compress.default, ops.relu_with_mask.default):
        return CheckpointPolicy.MUST_SAVE
    return CheckpointPolicy.PREFER_RECOMPUTE


def test_selective_checkpointing_saves_the_caches_and_recomputes_the_rest():
    def wide():
        torch.manual_seed(0)
        return nn.Sequential(*[m for _ in range(3) for m in (nn.Linear(256, 256), nn.GELU())])

    x = torch.randn(128, 256, requires_grad=True)
    reference = wide()
    dropit.convert(reference, gamma=0.9, skip_first=False, recompute=False)  # caches only
    model = copy.deepcopy(reference)
    context = functools.partial(create_selective_checkpoint_contexts, keep_dropit_caches)
    held = {}
    for name, run in (("plain", lambda: reference(x)),
                      ("selective", lambda: checkpoint(model, x, use_reentrant=False,
                                                       context_fn=context))):
        with dropit.memory.measure("cpu") as m:
            y = run()
        held[name] = m.retained_bytes - y.numel() * y.element_size()
        y.sum().backward()
    for a, e in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(a.grad, e.grad)
    # The plain model holds each GELU's input and every cache; the checkpointed one the caches only.
    cache_bytes = sum(dropit.Policy(gamma=0.9).plan((128, 256), torch.float32, -1)["bytes"]
                      for _ in range(3))
    gelu_inputs = 3 * 128 * 256 * 4
    assert held["plain"] >= gelu_inputs + cache_bytes
    assert held["selective"] <= 1.25 * cache_bytes + 4096


def test_functional_layers_with_policy_fields_compile_whole():
    """dropit.functional's layers given policy fields (not a Policy made outside) trace with no
    graph break, with eager's gradients; a bad field still fails, naming the value."""
    torch.manual_seed(0)
    x, image = torch.randn(8, 16), torch.randn(2, 3, 6, 6)
    weight = torch.randn(4, 16, requires_grad=True)
    kernel = torch.randn(5, 3, 3, 3, requires_grad=True)

    def step(x, image, gamma):
        y = dropit.functional.linear(x, weight, gamma=gamma, chunk_size=32)
        z = dropit.functional.conv2d(image, kernel, padding=1, gamma=gamma, chunk_size=32)
        return y.square().sum() + z.square().sum()

    compiled = torch.compile(step, fullgraph=True)
    actual = torch.autograd.grad(compiled(x, image, 0.5), (weight, kernel))
    expected = torch.autograd.grad(step(x, image, 0.5), (weight, kernel))
    for a, e in zip(actual, expected):
        torch.testing.assert_close(a, e)
    with pytest.raises(Exception, match=r"gamma = 1\.5 is outside \[0, 1\)"):
        compiled(x, image, 1.5)


@pytest.mark.skipif(not hasattr(getattr(torch.compiler, "config", None), "cache_key_tag"),
                    reason="this torch's compile caches have no key tag")
def test_compile_cache_keys_follow_dropit_operator_schemas():
    # A graph cached on disk calls the operators a layer's autograd kernel called when it was traced,
    # with their arguments then; a build of dropit whose schemas differ must miss that cache.
    tag = dropit._operators.compile_cache_tag()
    assert tag in torch.compiler.config.cache_key_tag.split()
    library = torch.library.Library("dropit", "FRAGMENT")
    library.define("cache_tag_probe(Tensor x) -> Tensor")
    assert dropit._operators.compile_cache_tag() != tag
    library._destroy()
    assert dropit._operators.compile_cache_tag() == tag
