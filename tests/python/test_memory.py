"""Memory measured at the allocator (dropit.memory) on a ResNet-18 and a small ViT, dense vs
dropit at gamma = 0.9 (chunked min-k, the default).

The expected saving is derived from the encodings (tests/python/savings.py, the design's
formulas), independently of the library and of the measurement. The measured drop of the
bytes held after forward must match that prediction within 10 % below (tensors the prediction
does not know of) and, on the CPU, 15 % above (allocator rounding of the dropped tensors).
"""

import copy

import pytest
import torch

import dropit
from savings import held_after_forward_and_step_peak, predicted_saving

torchvision = pytest.importorskip("torchvision", reason="torchvision is not installed")

MODELS = {
    "resnet18": (lambda: torchvision.models.resnet18(num_classes=10), (8, 3, 64, 64)),
    "vit": (lambda: torchvision.models.VisionTransformer(
        image_size=32, patch_size=4, num_layers=4, num_heads=4, hidden_dim=128, mlp_dim=512,
        num_classes=10), (16, 3, 32, 32)),
}


@pytest.mark.parametrize("name", MODELS)
def test_measured_saving_matches_the_encodings(name, device):
    make, shape = MODELS[name]
    torch.manual_seed(0)
    dense = make().to(device)
    model = copy.deepcopy(dense)
    report = dropit.convert(model, gamma=0.9)
    assert report.converted
    x = torch.randn(shape, device=device)
    for _ in range(2):  # the first step also allocates the parameters' gradients
        dense_held, dense_peak = held_after_forward_and_step_peak(dense, x)
        dropit_held, dropit_peak = held_after_forward_and_step_peak(model, x)
    expected = predicted_saving(model, x)
    saved = dense_held - dropit_held
    print(f"{name} on {device}: held after forward {dropit_held / dense_held:.3f}x dense, "
          f"peak {dropit_peak / dense_peak:.3f}x dense, saving {saved} B, predicted {expected} B")
    assert saved >= 0.9 * expected
    # On the CPU the prediction accounts for every tensor the dense model holds. On a GPU, torch's
    # CUDA kernels save other tensors (attention, normalisation), some of which dropit's layers
    # also release, so the saving may exceed the prediction there.
    if device.type == "cpu":
        assert saved <= 1.15 * expected
    # Backward allocates the same gradients either way and dropit's transient workspaces
    # (densified inputs, one layer at a time) must not undo what the caches saved.
    assert dropit_peak < dense_peak
