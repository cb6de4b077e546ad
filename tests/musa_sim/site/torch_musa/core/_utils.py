"""torch_musa.core._utils stand-in: device-index normalization (``torch.cuda._get_device_index`` under torchada)."""

from __future__ import annotations

import torch


def _get_musa_device_index(device=None, optional: bool = False, allow_cpu: bool = False) -> int:
    """Index of ``device`` (int, 'musa:N', torch.device or None = current device)."""
    from .device import current_device

    if device is None:
        return current_device()
    if isinstance(device, int):
        return device
    if isinstance(device, str):
        device = torch.device(device)
    if isinstance(device, torch.device):
        if device.type == "cpu" and allow_cpu:
            return -1
        if device.type not in ("musa", "cuda"):
            raise ValueError(f"Expected a musa device, but got: {device}")
        return current_device() if device.index is None else device.index
    raise ValueError(f"Cannot interpret {device!r} as a musa device")


_get_device_index = _get_musa_device_index
