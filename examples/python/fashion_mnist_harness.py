"""What the Fashion-MNIST example needs besides dropit itself: the data (Debian's
dataset-fashion-mnist, idx files), a training loop with a progress bar, and the CSV, plot and table
of the results. Kept apart so that train_fashion_mnist.py reads as the story of using dropit."""

import csv
import gzip
import os
import statistics
import time
from dataclasses import dataclass, field
from typing import Dict, List

import numpy as np
import torch
import torch.nn.functional as F

import dropit

DATA_DIR = "/usr/share/datasets/fashion-mnist"
PIXEL_MEAN, PIXEL_STD = 0.2860, 0.3530  # of the training images, in [0, 1]


def machine() -> str:
    """The CPU model and core count, without the host name."""
    try:
        with open("/proc/cpuinfo") as f:
            model = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        model = "unknown CPU"
    return f"{model}, {os.cpu_count()} cores"


def _idx(path: str) -> np.ndarray:
    with gzip.open(path, "rb") as f:
        data = f.read()
    dims = data[3]
    shape = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(dims)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


def load_split(prefix: str, limit: int = 0, data_dir: str = DATA_DIR):
    """Images [N, 1, 28, 28] normalised float32 and labels [N] int64 (kept at 28x28: ``resize``
    enlarges one batch at a time)."""
    images = os.path.join(data_dir, f"{prefix}-images-idx3-ubyte.gz")
    if not os.path.isfile(images):
        raise SystemExit(f"Fashion-MNIST not found at {data_dir}: install Debian's "
                         "dataset-fashion-mnist (scripts/install-deps does) or pass --data-dir")
    x = torch.from_numpy(_idx(images).copy()).float().div_(255).sub_(PIXEL_MEAN).div_(PIXEL_STD)
    y = torch.from_numpy(_idx(os.path.join(data_dir, f"{prefix}-labels-idx1-ubyte.gz")).copy())
    if limit > 0:
        x, y = x[:limit], y[:limit]
    return x.unsqueeze(1).contiguous(), y.long()


def resize(images: torch.Tensor, size: int) -> torch.Tensor:
    """A batch of [N, 1, 28, 28] images at ``size`` x ``size`` (bilinear; unchanged at 28)."""
    if images.shape[-1] == size:
        return images
    return F.interpolate(images, size=(size, size), mode="bilinear", align_corners=False)


@dataclass
class Run:
    """One model's training, step by step. Memory is measured at the allocator, in bytes above
    what was live when the step began (the weights, the batch, the optimizer's state)."""
    name: str
    losses: List[float] = field(default_factory=list)
    accuracy: List[float] = field(default_factory=list)  # test accuracy after each epoch, %
    step_seconds: List[float] = field(default_factory=list)
    step_peaks: List[int] = field(default_factory=list)  # highest bytes live during each step
    step_helds: List[int] = field(default_factory=list)  # bytes forward left for backward

    @property
    def first_step_peak_bytes(self) -> int:
        """The first step's peak: it also allocates the optimizer's momentum buffers."""
        return self.step_peaks[0]

    @property
    def peak_bytes(self) -> int:
        """The steady-state peak: the highest over the steps after the first, once the optimizer's
        state exists (the first step's peak when there is only one)."""
        return max(self.step_peaks[1:] or self.step_peaks)

    @property
    def held_bytes(self) -> int:
        """The most bytes forward left allocated for backward (the activation memory)."""
        return max(self.step_helds)


def measured_step(run: Run, model, optimizer, inputs, targets, loss_fn=F.cross_entropy):
    """One training step of ``model`` on a batch, recorded in ``run``: its loss, its time, its peak
    and the bytes its forward left allocated for backward, measured at the allocator."""
    start = time.perf_counter()
    with dropit.memory.measure("cpu") as memory:
        before = dropit.memory.live_bytes("cpu")
        loss = loss_fn(model(inputs), targets)
        held = dropit.memory.live_bytes("cpu") - before
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    run.step_seconds.append(time.perf_counter() - start)
    run.step_peaks.append(memory.peak_bytes)
    run.step_helds.append(held)
    run.losses.append(loss.item())


def evaluate(model, x, y, image_size: int = 28, batch: int = 500) -> float:
    model.eval()
    correct = 0
    with torch.no_grad():
        for i in range(0, len(x), batch):
            logits = model(resize(x[i:i + batch], image_size))
            correct += (logits.argmax(1) == y[i:i + batch]).sum().item()
    model.train()
    return 100.0 * correct / len(x)


def train_side_by_side(models: Dict[str, torch.nn.Module], train_set, test_set, epochs, batch, lr,
                      seed, image_size: int = 28) -> List[Run]:
    """SGD with momentum and a one-cycle schedule, on images resized to ``image_size``. The models
    take their steps in turn on the same batches, so that both see the same data and any slowdown
    of the machine hits both alike."""
    from tqdm import tqdm

    x, y = train_set
    steps = epochs * (len(x) // batch)
    runs, optimizers, schedules = [], [], []
    for name, model in models.items():
        runs.append(Run(name))
        optimizers.append(torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, nesterov=True,
                                          weight_decay=5e-4))
        schedules.append(torch.optim.lr_scheduler.OneCycleLR(optimizers[-1], max_lr=lr,
                                                             total_steps=steps))
        model.train()
    order = torch.Generator().manual_seed(seed)
    with tqdm(total=steps, unit="step") as bar:
        for epoch in range(epochs):
            permutation = torch.randperm(len(x), generator=order)
            for i in range(len(x) // batch):
                index = permutation[i * batch:(i + 1) * batch]
                images, labels = resize(x[index], image_size), y[index]
                for run, model, optimizer, schedule in zip(runs, models.values(), optimizers,
                                                           schedules):
                    measured_step(run, model, optimizer, images, labels)
                    schedule.step()
                bar.set_postfix({r.name: f"{r.losses[-1]:.3f}" for r in runs})
                bar.update()
            for run, model in zip(runs, models.values()):
                run.accuracy.append(evaluate(model, *test_set, image_size))
            bar.write(f"epoch {epoch + 1}: test accuracy " +
                      ", ".join(f"{r.name} {r.accuracy[-1]:.2f} %" for r in runs))
    return runs


def write_results(runs: List[Run], out_dir: str, header: str = ""):
    """losses.csv, curves.png (when matplotlib is there) and results.md (``header``, then the
    table); returns the table."""
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "losses.csv"), "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["step"] + [r.name for r in runs])
        for step, losses in enumerate(zip(*(r.losses for r in runs))):
            writer.writerow([step] + [f"{v:.5f}" for v in losses])
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
        for r in runs:
            smooth = np.convolve(r.losses, np.ones(20) / 20, mode="valid")
            left.plot(smooth, label=r.name)
            right.plot(range(1, len(r.accuracy) + 1), r.accuracy, marker="o", label=r.name)
        left.set(xlabel="step", ylabel="training loss (20-step mean)")
        right.set(xlabel="epoch", ylabel="test accuracy (%)")
        left.legend()
        right.legend()
        fig.tight_layout()
        fig.savefig(os.path.join(out_dir, "curves.png"), dpi=100)
    except ImportError:
        print("matplotlib is not installed: no plot")
    base = runs[0]
    lines = ["| run | test accuracy | peak step memory | vs dense | held after forward | vs dense "
             "| median step | step vs dense (median of per-step ratios) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in runs:
        ratio = statistics.median(a / b for a, b in zip(r.step_seconds, base.step_seconds))
        lines.append(f"| {r.name} | {r.accuracy[-1]:.2f} % | {r.peak_bytes / 2**20:.1f} MiB | "
                     f"{r.peak_bytes / base.peak_bytes:.2f}x | {r.held_bytes / 2**20:.1f} MiB | "
                     f"{r.held_bytes / base.held_bytes:.2f}x | "
                     f"{1000 * statistics.median(r.step_seconds):.1f} ms | {ratio:.2f}x |")
    first = ", ".join(f"{r.name} {r.first_step_peak_bytes / 2**20:.1f} MiB" for r in runs)
    notes = ("Memory is measured at the allocator, above what was live when the step began (the "
             "weights, the batch, the optimizer's state). Peak step memory: the highest over the "
             f"steps after the first ({len(base.step_peaks) - 1} steps); the first step also "
             "allocates the optimizer's momentum buffers (the same bytes in both runs) and peaks "
             f"higher ({first}). Held after forward: what forward leaves allocated for backward, "
             "the activation memory that dropit compresses (the highest over all steps). Test "
             "accuracy: one run of each, from one seed.")
    lines += ["", notes]
    table = "\n".join(lines)
    with open(os.path.join(out_dir, "results.md"), "w") as f:
        f.write((header + "\n\n" if header else "") + table + "\n")
    return table
