"""Memory statistics of the simulated MUSA devices, read from the extension's per-device byte counters.

There is no caching allocator: memory is returned to the host on free, so "reserved" equals "allocated" and
``empty_cache`` has nothing to do. Total memory is ``MUSA_SIM_MEMORY_GIB`` (default 48); nothing enforces it.
"""

from __future__ import annotations

from .._ext import ext
from ._utils import _get_musa_device_index
from .device import device_count, get_device_properties


def _stats(device=None) -> dict:
    return ext.memory_stats(_get_musa_device_index(device))


def memory_allocated(device=None) -> int:
    return _stats(device)["allocated_bytes"]


def max_memory_allocated(device=None) -> int:
    return _stats(device)["peak_allocated_bytes"]


memory_reserved = memory_allocated
max_memory_reserved = max_memory_allocated
memory_cached = memory_allocated
max_memory_cached = max_memory_allocated


def reset_peak_memory_stats(device=None) -> None:
    ext.reset_peak(_get_musa_device_index(device))


reset_max_memory_allocated = reset_peak_memory_stats
reset_max_memory_cached = reset_peak_memory_stats


def reset_accumulated_memory_stats(device=None) -> None:
    """The simulator keeps only current/peak bytes and allocation counts; nothing else to reset."""


def memory_stats(device=None) -> dict:
    s = _stats(device)
    stats = {}
    for kind in ("allocated_bytes", "reserved_bytes", "active_bytes"):
        stats[f"{kind}.all.current"] = s["allocated_bytes"]
        stats[f"{kind}.all.peak"] = s["peak_allocated_bytes"]
    stats["allocation.all.allocated"] = s["num_allocs"]
    stats["allocation.all.freed"] = s["num_frees"]
    stats["allocation.all.current"] = s["num_allocs"] - s["num_frees"]
    stats["num_alloc_retries"] = 0
    stats["num_ooms"] = 0
    return stats


def memory_summary(device=None, abbreviated: bool = False) -> str:
    s = _stats(device)
    return f"musa_sim device {_get_musa_device_index(device)}: " + ", ".join(f"{k}={v}" for k, v in s.items())


def empty_cache() -> None:
    """No cache to empty."""


def mem_get_info(device=None) -> tuple[int, int]:
    total = get_device_properties(device).total_memory
    return max(0, total - memory_allocated(device)), total


def memory_stats_all() -> list[dict]:
    return [ext.memory_stats(i) for i in range(device_count())]


class _NotSimulated:
    """Importable like torch_musa's class, but the simulator has no device allocator to plug into or pool."""

    def __init__(self, *args, **kwargs):
        raise RuntimeError(f"{type(self).__name__} is not available on the simulated MUSA device")


class MUSAPluggableAllocator(_NotSimulated):
    pass


class MemPool(_NotSimulated):
    pass


def use_mem_pool(pool, device=None):
    raise RuntimeError("use_mem_pool is not available on the simulated MUSA device")
