"""``--log-memory-interval N`` (with ``--log-device-memory-used``): every N iterations the ranks of data-parallel
rank 0 print Megatron-LM 0.16.1's memory line (megatron/training/utils.py ``report_memory``):
``[Rank R] (after I iterations) memory (MB) | allocated: A | max allocated: M | reserved: S | max reserved: X``
(``| total device memory used: U`` with ``--log-device-memory-used``), read from the active backend's device
module. The cpu backend has no device allocator: its line gives the process's resident memory instead.
May assume: process groups are up; called after each trained iteration.
"""

from __future__ import annotations

import torch
from megatron.core import parallel_state

from mtmegatron.backends.device import on_host
from mtmegatron.training.observability.section import Observability

MB = 1024.0 * 1024.0


def memory_line(device: torch.device, device_memory_used: bool) -> str:
    if on_host(device):
        import psutil

        rss = psutil.Process().memory_info().rss / MB
        return f"memory (MB) | resident (cpu backend, no device allocator): {rss:.2f}"
    module = torch.get_device_module(device.type)
    line = (f"memory (MB) | allocated: {module.memory_allocated(device) / MB:.2f}"
            f" | max allocated: {module.max_memory_allocated(device) / MB:.2f}"
            f" | reserved: {module.memory_reserved(device) / MB:.2f}"
            f" | max reserved: {module.max_memory_reserved(device) / MB:.2f}")
    if device_memory_used and hasattr(module, "device_memory_used"):
        line += f" | total device memory used: {module.device_memory_used(device) / MB:.2f}"
    return line


def maybe_report(observability: Observability, device: torch.device, iteration: int) -> None:
    interval = observability.log_memory_interval
    if not interval or iteration % interval or parallel_state.get_data_parallel_rank() != 0:
        return
    print(f"[Rank {torch.distributed.get_rank()}] (after {iteration} iterations) "
          f"{memory_line(device, observability.log_device_memory_used)}", flush=True)
