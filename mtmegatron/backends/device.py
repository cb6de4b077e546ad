"""The device this rank computes on: the active backend's device for LOCAL_RANK (cpu when none is active).

Batches are moved there before the forward, and small tensors that go through collectives are created there:
NCCL and MCCL reduce device tensors only, gloo (the CPU backend) host tensors.
May assume: the backend bridge was activated (mtmegatron.activate) before training starts.
"""

from __future__ import annotations

import os

import torch


def on_host(device: torch.device | str) -> bool:
    """Whether ``device`` is host memory (the cpu backend's device included): the one test of a tensor's place."""
    return torch.device(device).type == "cpu"


def compute_device() -> torch.device:
    from mtmegatron.backends.active import active_backend

    backend = active_backend()
    if backend is None:
        return torch.device("cpu")
    return backend.device(int(os.environ.get("LOCAL_RANK", "0")))


def move_module(module: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """``module.to(device)`` that keeps every parameter object, its sharing and its attributes.

    megatron-core marks parameters with Python attributes (``tensor_model_parallel``, ``sequence_parallel``,
    ``allreduce``, ...) that decide gradient reductions and norms. A plain ``Module.to`` from the host to a
    PrivateUse1 device (MUSA) cannot reuse the parameter (torch only shallow-copies between its built-in dense
    backends), so it builds new ``Parameter`` objects without those attributes: under sequence parallelism the
    layer-norm gradients would silently stop being all-reduced. Here the parameters are swapped in place
    (``torch.utils.swap_tensors``, which keeps identity and sharing) and their attributes put back.
    """
    if on_host(device):
        return module
    attributes = {id(p): dict(p.__dict__) for p in module.parameters()}
    swap = torch.__future__.get_swap_module_params_on_conversion()
    torch.__future__.set_swap_module_params_on_conversion(True)
    try:
        module.to(device)
    finally:
        torch.__future__.set_swap_module_params_on_conversion(swap)
    for param in module.parameters():
        param.__dict__.update(attributes[id(param)])
    return module


def to_compute_device(batch: dict) -> dict:
    """The batch's tensors on the compute device (no copy when they are there already)."""
    device = compute_device()
    return {key: value.to(device, non_blocking=True) if torch.is_tensor(value) else value
            for key, value in batch.items()}


def release_unused_memory(level: int, at: str) -> bool:
    """``--empty-unused-memory-level`` as Megatron-LM: 1 returns the device allocator's cached blocks after each
    training step, 2 also before validation (``at`` is "step" or "eval"). On the host backend there is no
    allocator cache (returns False)."""
    device = compute_device()
    if level < (1 if at == "step" else 2) or on_host(device):
        return False
    torch.get_device_module(device.type).empty_cache()
    return True
