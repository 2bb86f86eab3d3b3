"""dropit layers inside torch's machinery: autocast, torch.utils.checkpoint, torch.save/load."""

import copy
import io

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


@pytest.mark.parametrize("use_reentrant", [True, False])
def test_checkpoint_gives_the_same_gradients(use_reentrant):
    model, reference = mlp(), mlp()
    for m in (model, reference):
        dropit.convert(m, gamma=0.7, chunk_size=64, skip_first=False)
    x = torch.randn(8, 16, requires_grad=True)
    checkpoint(model, x, use_reentrant=use_reentrant).sum().backward()
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
