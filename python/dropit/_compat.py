"""The few torch APIs that differ between the supported versions (1.13 to 2.x)."""

import torch


def autocast_dtype(device_type: str):
    """The autocast dtype active for ``device_type``, or None when autocast is off there."""
    if device_type not in ("cpu", "cuda"):
        return None  # no autocast elsewhere; dropit refuses those devices with its own message
    if hasattr(torch, "get_autocast_dtype"):  # torch >= 2.4
        if not torch.is_autocast_enabled(device_type):
            return None
        return torch.get_autocast_dtype(device_type)
    if device_type == "cpu":
        return torch.get_autocast_cpu_dtype() if torch.is_autocast_cpu_enabled() else None
    if device_type == "cuda":
        return torch.get_autocast_gpu_dtype() if torch.is_autocast_enabled() else None
    return None
