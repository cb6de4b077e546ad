"""A ``torch.cuda``-shaped module over the CPU, installed as ``torch.cuda`` by the CPU bridge.

Megatron-core calls ``torch.cuda.*`` ~175 times (current device, streams, events, RNG, memory stats, nvtx).
On the CPU backend the host is the accelerator: streams and events are synchronous, the "device" RNG is the
CPU default generator (so dropout drawn inside the RNG tracker's ``fork()`` uses the tracker's own state,
which is saved/restored by value), memory statistics read the process's resident memory. Names this module
does not define fall through to the real ``torch.cuda`` (legacy tensor types, exceptions, amp helpers).
May assume: torch only. Used only while the CPU bridge is installed.
"""

from __future__ import annotations

import contextlib
import os
import resource
import sys
import time
import types
from dataclasses import dataclass

import torch


class Stream(torch.Stream):
    """A synchronous stream: work submitted on the CPU has finished when the call returns.

    A real ``torch.Stream`` (on cpu) so torch's own argument checks, e.g. ``Tensor.record_stream``, accept it.
    """

    def __new__(cls, device=None, priority: int = 0, **kwargs):
        return super().__new__(cls, "cpu", priority=priority)

    def __init__(self, device=None, priority: int = 0, **kwargs):
        self.priority = priority

    def wait_stream(self, stream) -> None:
        pass

    def wait_event(self, event) -> None:
        pass

    def record_event(self, event=None):
        event = event or Event()
        event.record(self)
        return event

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True

    def __eq__(self, other) -> bool:
        return isinstance(other, Stream)

    def __hash__(self) -> int:
        return 0


class Event:
    """A synchronous event; with ``enable_timing`` it stores the host time at ``record()``."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False, **kw):
        self.enable_timing = enable_timing
        self._time: float | None = None

    def record(self, stream=None) -> None:
        self._time = time.perf_counter()

    def wait(self, stream=None) -> None:
        pass

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass

    def elapsed_time(self, end: "Event") -> float:
        if not (self.enable_timing and end.enable_timing):
            raise RuntimeError("Events were not created with enable_timing=True")
        if self._time is None or end._time is None:
            raise RuntimeError("Both events must be recorded before calling elapsed_time()")
        return (end._time - self._time) * 1000.0


_DEFAULT_STREAM = Stream()
_current_stream = _DEFAULT_STREAM


def current_stream(device=None) -> Stream:
    return _current_stream


def default_stream(device=None) -> Stream:
    return _DEFAULT_STREAM


def set_stream(stream: Stream) -> None:
    global _current_stream
    _current_stream = stream


@contextlib.contextmanager
def stream(s: Stream | None):
    previous = current_stream()
    if s is not None:
        set_stream(s)
    try:
        yield s
    finally:
        set_stream(previous)


def synchronize(device=None) -> None:
    pass


# ---- device queries -------------------------------------------------------------------------------------
def is_available() -> bool:
    # False on purpose: torch's own code must not take its CUDA paths for CPU tensors.
    return False


def is_initialized() -> bool:
    return True


def device_count() -> int:
    return 1


def current_device() -> int:
    return 0


def set_device(device) -> None:
    pass


class device(contextlib.nullcontext):  # noqa: N801 - mirrors torch.cuda.device
    def __init__(self, device=None):
        super().__init__()
        self.idx = 0


device_of = device


@dataclass(frozen=True)
class _DeviceProperties:
    name: str
    total_memory: int
    major: int = 0
    minor: int = 0
    multi_processor_count: int = os.cpu_count() or 1
    # inductor's cache key (torch/_inductor/codecache.py: CacheBase.get_system) reads the "device" name from here
    # as ``gcnArchName`` when torch.version.cuda is None (a HIP build, or this CPU stand-in); without it every
    # torch.compile'd function (megatron-core's jit fusions) failed with an AttributeError
    gcnArchName: str = "cpu"  # noqa: N815 - torch's attribute name


def get_device_properties(device=None) -> _DeviceProperties:
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return _DeviceProperties(name="cpu", total_memory=total)


def get_device_name(device=None) -> str:
    return "cpu"


def get_device_capability(device=None) -> tuple[int, int]:
    return (0, 0)


# ---- RNG: the device generator is the CPU default generator -------------------------------------------
def get_rng_state(device="cuda") -> torch.Tensor:
    return torch.default_generator.get_state()


def set_rng_state(new_state: torch.Tensor, device="cuda") -> None:
    torch.default_generator.set_state(new_state)


def manual_seed(seed: int) -> None:
    torch.default_generator.manual_seed(int(seed))


manual_seed_all = manual_seed


def seed() -> None:
    torch.default_generator.seed()


seed_all = seed


def initial_seed() -> int:
    return torch.default_generator.initial_seed()


def get_rng_state_all() -> list[torch.Tensor]:
    return [get_rng_state()]


def set_rng_state_all(states) -> None:
    set_rng_state(states[0])


default_generators = (torch.default_generator,)

random = types.SimpleNamespace(
    get_rng_state=get_rng_state,
    set_rng_state=set_rng_state,
    manual_seed=manual_seed,
    manual_seed_all=manual_seed_all,
    seed=seed,
    initial_seed=initial_seed,
)


def _lazy_call(callable, **kwargs) -> None:
    # torch.cuda queues these until CUDA initialises, which never happens on the CPU backend.
    callable()


def _lazy_init() -> None:
    pass


# ---- memory: the process's resident set --------------------------------------------------------------
def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _max_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def memory_allocated(device=None) -> int:
    return _rss_bytes()


memory_reserved = memory_allocated


def max_memory_allocated(device=None) -> int:
    # ru_maxrss is sampled by the kernel and can trail the current RSS while memory grows
    return max(_max_rss_bytes(), _rss_bytes())


max_memory_reserved = max_memory_allocated


def memory_stats(device=None) -> dict:
    current = _rss_bytes()
    peak = max(_max_rss_bytes(), current)
    return {
        "allocated_bytes.all.current": current,
        "allocated_bytes.all.peak": peak,
        "reserved_bytes.all.current": current,
        "reserved_bytes.all.peak": peak,
        "num_alloc_retries": 0,
        "num_ooms": 0,
    }


def mem_get_info(device=None) -> tuple[int, int]:
    props = get_device_properties()
    return (props.total_memory - _rss_bytes(), props.total_memory)


def empty_cache() -> None:
    pass


def reset_peak_memory_stats(device=None) -> None:
    pass


reset_max_memory_allocated = reset_peak_memory_stats

memory = types.SimpleNamespace(
    memory_allocated=memory_allocated,
    max_memory_allocated=max_memory_allocated,
    memory_reserved=memory_reserved,
    memory_stats=memory_stats,
    empty_cache=empty_cache,
)

# ---- profiling markers ----------------------------------------------------------------------------------
nvtx = types.SimpleNamespace(
    range_push=lambda msg: 0,
    range_pop=lambda: 0,
    mark=lambda msg: None,
    range=lambda msg, *a, **k: contextlib.nullcontext(),
)


def build_module(real_cuda: types.ModuleType) -> types.ModuleType:
    """A module object exposing this file's API, falling back to ``real_cuda`` for anything else."""

    class CpuDeviceModule(types.ModuleType):
        def __getattr__(self, name):
            return getattr(real_cuda, name)

    module = CpuDeviceModule("torch.cuda", __doc__)
    this = sys.modules[__name__]
    for name in __all__:
        setattr(module, name, getattr(this, name))
    return module


__all__ = [
    "Stream", "ExternalStream", "Event", "current_stream", "default_stream", "set_stream", "stream",
    "synchronize", "is_available", "is_initialized", "device_count", "current_device", "set_device", "device",
    "device_of", "get_device_properties", "get_device_name", "get_device_capability", "get_rng_state",
    "set_rng_state", "manual_seed", "manual_seed_all", "seed", "seed_all", "initial_seed", "get_rng_state_all",
    "set_rng_state_all", "default_generators", "random", "_lazy_call", "_lazy_init", "memory_allocated",
    "memory_reserved", "max_memory_allocated", "max_memory_reserved", "memory_stats", "mem_get_info",
    "empty_cache", "reset_peak_memory_stats", "reset_max_memory_allocated", "memory", "nvtx",
]
ExternalStream = Stream
