"""dropit's registered operators (torch.ops.dropit.*) under torch.library.opcheck: schema,
autograd registration, fake (meta) kernels against the real ones, and AOT dispatch with static and
dynamic shapes, for contiguous, channels-last and non-contiguous inputs in every dtype."""

import pytest
import torch
from torch.library import opcheck

import dropit
from cases import DTYPES

ops = torch.ops.dropit
POLICY = dropit.Policy(gamma=0.75, chunk_size=64)
RANDOM = dropit.Policy(gamma=0.75, policy="random", chunk_size=64, seed=3)
CHANNELS = dropit.Policy(gamma=0.5, policy="min_k", granularity="channel")

LAYOUTS = {
    "contiguous": lambda x: x,
    "channels_last": lambda x: x.to(memory_format=torch.channels_last),
    # The same shape in a strided (non-contiguous) layout, read through a copy.
    "non_contiguous": lambda x: x.transpose(2, 3).contiguous().transpose(2, 3),
}


def check(op, args):
    results = opcheck(op, args)
    assert all(result == "SUCCESS" for result in results.values()), results


def activation(device, dtype, layout):
    return LAYOUTS[layout](torch.randn(2, 6, 7, 9, device=device, dtype=dtype))


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("policy", [POLICY, RANDOM, CHANNELS], ids=["chunked", "random", "channel"])
def test_cache_operators(policy, dtype, layout, device):
    x = activation(device, dtype, layout)
    arguments = policy.arguments(channel_axis=1, call=5)
    check(ops.compress, (x, *arguments))
    values, positions = ops.compress(x, *arguments)
    # The cache is the contiguous tensor's whatever the layout: channels-last is read in place, in
    # its logical order.
    want_values, want_positions = ops.compress(x.contiguous(), *arguments)
    assert torch.equal(values, want_values) and torch.equal(positions, want_positions)
    layout_words = policy.plan(x.shape, dtype, channel_axis=1, call=5)["layout"]
    check(ops.densify, (values, positions, layout_words))
    dense = ops.densify(values, positions, layout_words)
    kept = dense != 0
    assert torch.equal(dense[kept], x[kept])  # each value back at its own position in x
    # The weight gradient of a 3x3 convolution over x (padding 1), on both paths.
    dz = torch.randn(2, 4, 7, 9, device=device, dtype=dtype)
    for path in ("sparse", "densify"):
        check(ops.conv2d_weight_grad, (values, positions, layout_words, dz, [4, 6, 3, 3], [1, 1],
                                       [1, 1], [1, 1], 1, path))


@pytest.mark.parametrize("dtype", DTYPES)
def test_linear_weight_grad_operator(dtype, device):
    x = torch.randn(3, 5, 40, device=device, dtype=dtype)
    arguments = POLICY.arguments(channel_axis=-1, call=0)
    values, positions = ops.compress(x, *arguments)
    layout_words = POLICY.plan(x.shape, dtype, channel_axis=-1)["layout"]
    dz = torch.randn(15, 8, device=device, dtype=dtype)
    for path in ("sparse", "densify"):
        check(ops.linear_weight_grad, (values, positions, layout_words, dz, path))


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_relu_operators(dtype, layout, device):
    x = activation(device, dtype, layout)
    check(ops.relu_with_mask, (x,))
    output, mask = ops.relu_with_mask(x)
    channels_last = layout == "channels_last"
    assert output.is_contiguous(
        memory_format=torch.channels_last if channels_last else torch.contiguous_format)
    assert torch.equal(output, torch.relu(x))
    # The mask is in the tensor's logical order whatever its layout: bit i stands for element i of
    # the flattened tensor, as a reference packs it from torch's own comparison.
    passes = torch.cat([(x > 0).flatten().int(), x.new_zeros(-x.numel() % 32, dtype=torch.int)])
    weights = torch.tensor([1 << bit for bit in range(31)] + [-(1 << 31)], device=device)
    assert torch.equal(mask, (passes.view(-1, 32) * weights).sum(1).int())
    # So a gradient in any layout reads it, and dx keeps the gradient's layout.
    for name, to_layout in LAYOUTS.items():
        grad = to_layout(torch.randn(x.shape, device=device, dtype=dtype))
        check(ops.relu_backward, (grad, mask))
        dx = ops.relu_backward(grad, mask)
        assert torch.equal(dx, torch.where(x > 0, grad, torch.zeros_like(grad)))
        if name != "non_contiguous":
            assert dx.stride() == grad.stride()
    check(ops.relu, (x.detach().requires_grad_(),))


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_layer_operators(dtype, layout, device):
    x = activation(device, dtype, layout).requires_grad_()
    weight = torch.randn(4, 6, 3, 3, device=device, dtype=dtype, requires_grad=True)
    bias = torch.randn(4, device=device, dtype=dtype, requires_grad=True)
    check(ops.conv2d, (x, weight, bias, [1, 2], [1, 1], [1, 1], 1,
                       *POLICY.arguments(channel_axis=1, call=0)))
    rows = torch.randn(5, 9, device=device, dtype=dtype).t().requires_grad_()  # non-contiguous
    linear_weight = torch.randn(3, 5, device=device, dtype=dtype, requires_grad=True)
    check(ops.linear, (rows, linear_weight, None, *POLICY.arguments(channel_axis=-1, call=0)))


def test_layers_keep_channels_last(device):
    conv = dropit.nn.Conv2d(6, 4, 3, padding=1, gamma=0.5).to(device)
    relu = dropit.nn.ReLU()
    reference = torch.nn.Conv2d(6, 4, 3, padding=1).to(device)
    reference.load_state_dict(conv.state_dict())
    x = torch.randn(2, 6, 7, 9, device=device).to(memory_format=torch.channels_last)
    y = relu(conv(x.requires_grad_()))
    assert y.is_contiguous(memory_format=torch.channels_last) and not y.is_contiguous()
    torch.testing.assert_close(y, torch.relu(reference(x)))


def test_strided_inputs_give_the_cache_of_their_contiguous_copy():
    x = torch.randn(6, 40).t()
    strided, copied = dropit.functional.compress(x, POLICY), dropit.functional.compress(
        x.contiguous(), POLICY)
    assert torch.equal(strided.values, copied.values)
    assert torch.equal(strided.positions, copied.positions)


def test_meta_tensors_get_the_planned_cache_shapes():
    x = torch.empty(3, 5, 40, device="meta")
    values, positions = ops.compress(x, *POLICY.arguments(channel_axis=-1, call=0))
    plan = POLICY.plan(x.shape, x.dtype, channel_axis=-1)
    assert values.device.type == "meta" and values.shape == (plan["kept"],)
    assert positions.dtype == torch.int32 and positions.shape == (plan["position_words"],)
    weight = torch.empty(7, 40, device="meta", requires_grad=True)
    y = dropit.functional.linear(x, weight, gamma=0.75, chunk_size=64)
    assert y.device.type == "meta" and y.shape == (3, 5, 7)


def test_operator_errors_are_value_errors():
    x = torch.randn(4, 8)
    with pytest.raises(ValueError, match="gamma"):
        ops.compress(x, "chunked_min_k", "element", 1, 1.5, 64, 0, 0, False)
    with pytest.raises(ValueError, match="Double; expected float32"):
        ops.compress(x.double(), *POLICY.arguments(1, 0))
    with pytest.raises(ValueError, match="layout"):
        ops.densify(torch.empty(2), torch.empty(1, dtype=torch.int32), [1, 2, 3])


class _OperatorLog(torch.overrides.TorchFunctionMode):
    """Records the dropit operators a forward calls through torch's dispatch."""

    def __init__(self):
        super().__init__()
        self.called = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if str(func).startswith("dropit."):
            self.called.append(str(func))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("policy", [POLICY, RANDOM], ids=["chunked", "random"])
def test_eager_layers_call_the_operators_directly_and_modes_still_see_them(policy):
    # Eager layers reach their operators from C++ (no argument parsing per call); the results and
    # gradients are the operators' own, and a torch function mode still sees the operator.
    torch.manual_seed(0)
    linear = dropit.nn.Linear(9, 5, dropit_policy=policy)
    conv = dropit.nn.Conv2d(6, 4, 3, padding=1, dropit_policy=policy)
    relu = dropit.nn.ReLU()
    x = torch.randn(2, 6, 7, 9, requires_grad=True)

    def step(seed):
        torch.manual_seed(seed)  # random selection draws its key from torch's generator
        for p in (x, *linear.parameters(), *conv.parameters()):
            p.grad = None
        y = linear(relu(conv(x)))
        y.square().sum().backward()
        return [y.detach()] + [p.grad.clone() for p in (x, *linear.parameters(),
                                                         *conv.parameters())]

    direct = step(1)
    with _OperatorLog() as log:
        through_operators = step(1)
    assert log.called == ["dropit.conv2d.default", "dropit.relu.default", "dropit.linear.default"]
    for a, b in zip(direct, through_operators):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
