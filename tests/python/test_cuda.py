"""dropit on CUDA tensors, beyond the layer and memory tests that run on every device
(test_layers.py, test_memory.py take the `device` fixture):

- the CUDA backend's caches are the CPU backend's, bit for bit (values, positions, densified);
- a converted ResNet-18 trains on CUDA like the dense one at gamma = 0, under autocast too, and so
  does a model of the other converted layers (Conv3d, Conv1d, attention, Hugging Face's Conv1D);
- a dropit training step never synchronises the device (torch's sync debug mode raises if it does);
- work runs on torch's current stream and on the tensor's device;
- a convolution after BatchNorm -> ReLU recomputes its input from the statistics cuDNN saved.

Skipped, saying so, without a CUDA device; with one, a dropit built without CUDA fails them.
"""

import copy

import pytest
import torch

import dropit
from cases import DTYPES, POLICIES, Sequence
from test_recompute import conv_stack

if not torch.cuda.is_available():
    pytest.skip("no CUDA device: the CUDA tests are skipped", allow_module_level=True)

torchvision = pytest.importorskip("torchvision", reason="torchvision is not installed")

# The shared cases, and chunked min-k with longer chunks.
POLICIES = POLICIES + [dict(policy="chunked_min_k", chunk_size=4096)]
# Shapes with a partial last chunk, one smaller than a chunk, and an empty one.
SHAPES = [(4, 16, 9, 9), (3, 1000), (5,), (0, 8)]


def test_this_build_takes_cuda_tensors():
    assert dropit._C.built_with_cuda, "dropit was built without CUDA on a machine with a GPU"


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: ",".join(map(str, p.values())))
@pytest.mark.parametrize("gamma", [0.0, 0.5, 0.9])
def test_cuda_cache_equals_cpu_cache_bit_for_bit(shape, dtype, policy, gamma):
    if policy.get("granularity") == "channel" and len(shape) < 2:
        pytest.skip("channel granularity needs a channel axis")
    x = torch.randn(shape).to(dtype)
    if x.numel():
        x.view(-1)[::7] = x.view(-1)[0]  # ties
    cpu = dropit.functional.compress(x, gamma=gamma, channel_axis=1 % max(x.dim(), 1), **policy)
    gpu = dropit.functional.compress(x.cuda(), gamma=gamma, channel_axis=1 % max(x.dim(), 1),
                                     **policy)
    assert gpu.values.is_cuda and gpu.positions.is_cuda
    assert torch.equal(gpu.values.cpu(), cpu.values)
    assert torch.equal(gpu.positions.cpu(), cpu.positions)
    assert gpu.nbytes == cpu.nbytes
    assert torch.equal(dropit.functional.densify(gpu).cpu(), dropit.functional.densify(cpu))


def resnet_pair(gamma):
    torch.manual_seed(0)
    dense = torchvision.models.resnet18(num_classes=10).cuda()
    model = copy.deepcopy(dense)
    dropit.convert(model, gamma=gamma)
    return dense, model


def step(model, x, target, autocast_dtype=None):
    model.zero_grad(set_to_none=True)
    with torch.autocast("cuda", dtype=autocast_dtype, enabled=autocast_dtype is not None):
        loss = torch.nn.functional.cross_entropy(model(x), target)
    loss.backward()
    return loss.detach(), {n: p.grad.detach().clone() for n, p in model.named_parameters()}


def check_step_equals_dense(dense, model, x, target, autocast_dtype):
    dense_loss, dense_grads = step(dense, x, target, autocast_dtype)
    loss, grads = step(model, x, target, autocast_dtype)
    tolerance = 1e-3 if autocast_dtype is None else 5e-2
    torch.testing.assert_close(loss, dense_loss, rtol=tolerance, atol=tolerance)
    for name, grad in dense_grads.items():
        scale = max(grad.abs().max().item(), 1e-3)
        torch.testing.assert_close(grads[name], grad, rtol=0, atol=tolerance * scale, msg=name)


@pytest.mark.parametrize("autocast_dtype", [None, torch.bfloat16, torch.float16],
                         ids=["fp32", "autocast-bf16", "autocast-fp16"])
def test_gamma_zero_resnet18_step_equals_dense(autocast_dtype):
    dense, model = resnet_pair(gamma=0.0)
    x = torch.randn(4, 3, 64, 64, device="cuda")
    target = torch.randint(0, 10, (4,), device="cuda")
    check_step_equals_dense(dense, model, x, target, autocast_dtype)


def test_training_step_never_synchronises_the_device():
    _, model = resnet_pair(gamma=0.9)
    x = torch.randn(4, 3, 64, 64, device="cuda")
    target = torch.randint(0, 10, (4,), device="cuda")
    step(model, x, target)  # the first step may set up cuDNN and the allocator
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        loss = torch.nn.functional.cross_entropy(model(x), target)
        loss.backward()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()


def test_work_runs_on_torchs_current_stream():
    # A side stream is kept busy and only then fills x. Torch's streams do not wait for the legacy
    # default stream nor it for them, so compress sees x's values only if it runs on the side
    # stream, the current one, after the fill; anywhere else it would read zeros.
    source = torch.randn(1 << 20)
    expected = dropit.functional.densify(dropit.functional.compress(source, gamma=0.5))
    source_gpu = source.cuda()
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        x = torch.zeros_like(source_gpu)
        torch.cuda._sleep(100_000_000)  # tens of milliseconds of GPU time
        x.copy_(source_gpu)
        dense = dropit.functional.densify(dropit.functional.compress(x, gamma=0.5))
    stream.synchronize()
    assert torch.equal(dense.cpu(), expected)


def test_cache_and_gradient_on_different_devices_are_refused():
    cache = dropit.functional.compress(torch.randn(8, 16), gamma=0.5)
    with pytest.raises(ValueError, match="cache is on cpu but dZ on cuda"):
        torch.ops.dropit.linear_weight_grad(cache.values, cache.positions, cache.layout,
                                     torch.randn(8, 4, device="cuda"))


def test_a_tensor_on_another_device_than_the_current_one():
    if torch.cuda.device_count() < 2:
        pytest.skip("one CUDA device: the two-device case is skipped")
    x = torch.randn(64, 32, device="cuda:1")
    cache = dropit.functional.compress(x, gamma=0.5)
    assert cache.values.device == x.device
    torch.testing.assert_close(dropit.functional.densify(cache).cpu(),
                               dropit.functional.densify(dropit.functional.compress(x.cpu(),
                                                                                    gamma=0.5)))


@pytest.mark.parametrize("autocast_dtype", [None, torch.bfloat16], ids=["fp32", "autocast-bf16"])
def test_gamma_zero_sequence_layers_step_equals_dense(autocast_dtype):
    dense = Sequence().cuda()
    model = copy.deepcopy(dense)
    dropit.convert(model, gamma=0.0, skip_first=False)
    x = torch.randn(3, 2, 6, 4, 4, device="cuda")
    target = torch.randint(0, 10, (3,), device="cuda")
    check_step_equals_dense(dense, model, x, target, autocast_dtype)


@pytest.fixture
def exact_cudnn():
    """cuDNN in float32 without TF32 and with deterministic algorithms, restored afterwards."""
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cudnn.deterministic
    torch.backends.cudnn.allow_tf32, torch.backends.cudnn.deterministic = False, True
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cudnn.deterministic = saved


@pytest.mark.parametrize("memory_format", [torch.contiguous_format, torch.channels_last])
def test_convolutions_after_batch_norm_and_relu_recompute_from_cudnns_statistics(
        exact_cudnn, memory_format, monkeypatch):
    probe = torch.nn.BatchNorm2d(16).cuda()(torch.randn(8, 16, 4, 4, device="cuda",
                                                         requires_grad=True))
    assert type(probe.grad_fn).__name__ == "CudnnBatchNormBackward0"  # what this test is about
    dense = conv_stack().cuda()
    model = copy.deepcopy(dense)
    x = torch.randn(8, 3, 24, 24, device="cuda").contiguous(memory_format=memory_format)
    dropit.convert(model, gamma=0.9, example_input=x)
    dense(x).square().sum().backward()
    loss = model(x).square().sum()

    def batch_norm_again(*args, **kwargs):
        raise AssertionError("backward ran batch norm again")

    # One affine pass from the statistics cuDNN's kernel saved: no batch norm in backward.
    monkeypatch.setattr(torch.nn.functional, "batch_norm", batch_norm_again)
    loss.backward()
    for (name, actual), expected in zip(model.named_parameters(), dense.parameters()):
        # Within rounding: the recomputed inputs round the normalisation in their own order.
        torch.testing.assert_close(actual.grad, expected.grad, rtol=0,
                                   atol=1e-5 * expected.grad.abs().max().item(), msg=name)
