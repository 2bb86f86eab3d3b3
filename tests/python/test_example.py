"""The Fashion-MNIST example's harness (examples/python/fashion_mnist_harness.py), on a small CNN and
random images: what its table reports. The peak is the steady state's, taken over the steps after
the first (which also allocates the optimizer's momentum buffers), and the table gives it beside the
bytes forward holds for backward, both against dense."""

import copy
import os
import sys

import pytest
import torch
from torch import nn

import dropit

pytest.importorskip("tqdm", reason="the example's harness needs tqdm (python3 -m pip install tqdm)")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples", "python"))
import fashion_mnist_harness as harness  # noqa: E402


def small_cnn():
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
        nn.Conv2d(16, 32, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(),
        nn.Conv2d(32, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10))


def test_harness_reports_steady_peak_and_held_after_forward(tmp_path):
    batch, steps, size = 16, 4, 32
    generator = torch.Generator().manual_seed(0)
    train_set = (torch.randn(batch * steps, 1, 28, 28, generator=generator),
                 torch.randint(0, 10, (batch * steps,), generator=generator))
    test_set = (torch.randn(40, 1, 28, 28, generator=generator),
                torch.randint(0, 10, (40,), generator=generator))
    dense = small_cnn()
    converted = copy.deepcopy(dense)
    # recompute=False: every layer caches. (Recomputing a convolution's input after BatchNorm ->
    # ReLU lowers what is held after forward, but the step's peak, set in backward where the
    # recomputed input exists as dense's saved one does, stays dense's plus the 1-bit masks.)
    dropit.convert(converted, gamma=0.9, recompute=False,
                   example_input=harness.resize(train_set[0][:batch], size))

    runs = harness.train_side_by_side({"dense": dense, "dropit": converted}, train_set, test_set,
                                      1, batch, 0.01, 0, image_size=size)

    for run in runs:
        assert len(run.step_peaks) == len(run.step_helds) == len(run.losses) == steps
        assert run.first_step_peak_bytes == run.step_peaks[0]
        assert run.peak_bytes == max(run.step_peaks[1:])
        # The first step allocates the momentum buffers besides all that the later steps do.
        assert run.first_step_peak_bytes > run.peak_bytes
        assert 0 < run.held_bytes <= run.peak_bytes
        assert len(run.accuracy) == 1
    dense_run, dropit_run = runs
    assert dropit_run.held_bytes < dense_run.held_bytes
    assert dropit_run.peak_bytes < dense_run.peak_bytes

    table = harness.write_results(runs, str(tmp_path), "header")
    header, separator, dense_row, dropit_row = table.splitlines()[:4]
    columns = [c.strip() for c in header.strip("|").split("|")]
    assert columns[:6] == ["run", "test accuracy", "peak step memory", "vs dense",
                           "held after forward", "vs dense"]
    cells = [c.strip() for c in dropit_row.strip("|").split("|")]
    assert cells[3] == f"{dropit_run.peak_bytes / dense_run.peak_bytes:.2f}x"
    assert cells[5] == f"{dropit_run.held_bytes / dense_run.held_bytes:.2f}x"
    assert [c.strip() for c in dense_row.strip("|").split("|")][3] == "1.00x"
    assert f"steps after the first ({steps - 1} steps)" in table
    with open(tmp_path / "results.md") as f:
        assert f.read() == "header\n\n" + table + "\n"
    assert (tmp_path / "losses.csv").is_file()
