"""dropit layers inside torch's machinery: autocast, torch.utils.checkpoint, torch.save/load."""

import copy
import io
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

import dropit


def mlp():
    torch.manual_seed(1)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(),
                         nn.Linear(32, 4))


def grads(model):
    return [p.grad.clone() for p in model.parameters()]


def test_cpu_autocast_bfloat16_matches_torch_at_gamma_zero():
    model, reference = mlp(), mlp()
    dropit.convert(model, gamma=0.0, skip_first=False)
    x = torch.randn(8, 16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = model(x)
        y_ref = reference(x)
    assert y.dtype == y_ref.dtype == torch.bfloat16
    torch.testing.assert_close(y, y_ref)
    y.float().sum().backward()
    y_ref.float().sum().backward()
    for g, g_ref in zip(grads(model), grads(reference)):
        assert g.dtype == torch.float32  # parameters stay float32 under autocast
        torch.testing.assert_close(g, g_ref, rtol=2e-2, atol=2e-2)


def test_autocast_conv2d_runs_in_bfloat16():
    conv = dropit.nn.Conv2d(3, 4, 3, padding=1, gamma=0.5)
    x = torch.randn(2, 3, 8, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = conv(x)
    assert y.dtype == torch.bfloat16
    y.float().sum().backward()
    assert conv.weight.grad.dtype == torch.float32 and conv.weight.grad.abs().sum() > 0


@pytest.mark.parametrize("policy", ["chunked_min_k", "random"])
@pytest.mark.parametrize("use_reentrant", [True, False])
def test_checkpoint_gives_the_same_gradients(use_reentrant, policy):
    # Random selection: checkpointing restores torch's generator, so the forward recomputed in
    # backward draws the positions the first forward drew.
    model, reference = mlp(), mlp()
    for m in (model, reference):
        dropit.convert(m, gamma=0.7, chunk_size=64, skip_first=False, policy=policy)
    x = torch.randn(8, 16, requires_grad=True)
    torch.manual_seed(2)
    checkpoint(model, x, use_reentrant=use_reentrant).sum().backward()
    torch.manual_seed(2)
    reference(x.detach().requires_grad_(True)).sum().backward()
    for g, g_ref in zip(grads(model), grads(reference)):
        torch.testing.assert_close(g, g_ref)


def test_save_and_load_whole_model_and_state_dict():
    model = mlp()
    dropit.convert(model, gamma=0.9)
    buffer = io.BytesIO()
    torch.save({"model": model, "state": model.state_dict()}, buffer)
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=False)
    x = torch.randn(5, 16)
    torch.testing.assert_close(saved["model"](x), model(x))
    fresh = mlp()
    fresh.load_state_dict(saved["state"])
    torch.testing.assert_close(fresh(x), model(x))


def test_checkpoint_frees_the_caches_too():
    """Non-reentrant checkpointing drops what a region saves and recomputes it in backward; the
    dropit caches must be dropped with the rest (they travel through save_for_backward)."""
    def wide():
        torch.manual_seed(0)
        return nn.Sequential(*[m for _ in range(4) for m in (nn.Linear(512, 512), nn.ReLU())])

    x = torch.randn(256, 512, requires_grad=True)
    held = {}
    for name in ("dense", "dropit"):
        model = wide()
        if name == "dropit":
            dropit.convert(model, gamma=0.9, skip_first=False)
        for checkpointed in (False, True):
            with dropit.memory.measure("cpu") as m:
                y = checkpoint(model, x, use_reentrant=False) if checkpointed else model(x)
            held[name, checkpointed] = m.retained_bytes - y.numel() * y.element_size()
            y.sum().backward()
            del y
    assert held["dropit", False] < 0.5 * held["dense", False]
    # With checkpointing both keep only the region's input and bookkeeping.
    assert held["dropit", True] <= held["dense", True] + 4096
    assert held["dropit", True] < 0.2 * held["dropit", False]


def test_memory_measurements_nest():
    with dropit.memory.measure("cpu") as outer:
        big = torch.empty(1 << 20)  # 4 MiB
        del big
        with dropit.memory.measure("cpu") as inner:
            small = torch.empty(1 << 10)
        del small
    assert 4 << 20 <= outer.peak_bytes < (4 << 20) + (64 << 10)
    assert 4 << 10 <= inner.peak_bytes < 64 << 10


def test_import_dropit_alone():
    """`import dropit` in a fresh interpreter, torch not imported first."""
    result = subprocess.run([sys.executable, "-c", "import dropit; print(dropit.__version__)"],
                            capture_output=True, text=True, env=dict(os.environ))
    assert result.returncode == 0, result.stderr
