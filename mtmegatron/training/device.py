"""The device this rank computes on: the active backend's device for LOCAL_RANK (cpu when none is active).

Batches are moved there before the forward, and small tensors that go through collectives are created there:
NCCL and MCCL reduce device tensors only, gloo (the CPU backend) host tensors.
May assume: the backend bridge was activated (mtmegatron.activate) before training starts.
"""

from __future__ import annotations

import os

import torch


def compute_device() -> torch.device:
    from mtmegatron import active_backend

    backend = active_backend()
    if backend is None:
        return torch.device("cpu")
    return backend.device(int(os.environ.get("LOCAL_RANK", "0")))


def to_compute_device(batch: dict) -> dict:
    """The batch's tensors on the compute device (no copy when they are there already)."""
    device = compute_device()
    return {key: value.to(device, non_blocking=True) if torch.is_tensor(value) else value
            for key, value in batch.items()}
