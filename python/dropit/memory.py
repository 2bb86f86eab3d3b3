"""Memory measured at the allocator, never added up from intended sizes.

CPU: the counting allocator of dropit's C++ side (``dropit::torch::MemoryMeter``), installed as
torch's CPU allocator the first time a CPU measurement starts; tensors allocated before that are not
counted, so measurements are relative to the bytes live when the measurement starts. CUDA: torch's
caching allocator statistics.

    with dropit.memory.measure("cpu") as m:
        loss = model(x).sum(); loss.backward()
    print(m.peak_bytes)        # highest bytes live during the block, above those live at its start
"""

from dataclasses import dataclass
from typing import Union

import torch

from . import _C

__all__ = ["Measurement", "measure", "live_bytes"]

_cpu_meter = None


def _cpu():
    global _cpu_meter
    if _cpu_meter is None:
        _cpu_meter = _C.CpuMemoryMeter()
    return _cpu_meter


def _device(device) -> torch.device:
    device = torch.device(device)
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"dropit.memory measures cpu and cuda devices, not {device}")
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def live_bytes(device: Union[str, torch.device] = "cpu") -> int:
    """Bytes of tensors live on ``device`` now (on the CPU: of those allocated since the counter
    was installed)."""
    device = _device(device)
    if device.type == "cpu":
        return _cpu().current()
    return torch.cuda.memory_allocated(device)


@dataclass
class Measurement:
    device: torch.device
    start_bytes: int = 0  # live when the block began
    end_bytes: int = 0  # live when it ended
    peak_bytes: int = 0  # highest live during the block, minus start_bytes

    @property
    def retained_bytes(self) -> int:
        """Bytes allocated in the block and still live after it (e.g. saved for backward)."""
        return self.end_bytes - self.start_bytes


class measure:
    """Context manager measuring the peak bytes allocated on ``device`` during its block. Blocks
    may nest: an inner measurement resets the allocator's peak, so the outer ones fold in what they
    had seen first."""

    _open = []  # measurements in progress, outermost first

    def __init__(self, device: Union[str, torch.device] = "cpu"):
        self.result = Measurement(_device(device))
        self._peak_seen = 0  # absolute peak seen before an inner measurement reset the counter

    def _absolute_peak(self) -> int:
        device = self.result.device
        if device.type == "cpu":
            return _cpu().peak()
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device)

    def _reset_peak(self):
        device = self.result.device
        if device.type == "cpu":
            _cpu().reset_peak()
        else:
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)

    def __enter__(self) -> Measurement:
        for outer in measure._open:
            if outer.result.device == self.result.device:
                outer._peak_seen = max(outer._peak_seen, outer._absolute_peak())
        self._reset_peak()
        self.result.start_bytes = live_bytes(self.result.device)
        measure._open.append(self)
        return self.result

    def __exit__(self, *exc):
        measure._open.remove(self)
        peak = max(self._peak_seen, self._absolute_peak())
        self.result.end_bytes = live_bytes(self.result.device)
        self.result.peak_bytes = peak - self.result.start_bytes
        for outer in measure._open:
            if outer.result.device == self.result.device:
                outer._peak_seen = max(outer._peak_seen, peak)
        return False
