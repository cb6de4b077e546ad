"""CPU bridge: makes unmodified megatron-core run on the host with gloo collectives.

install(): ``torch.cuda`` becomes the CPU device module (cpu_device.py), megatron-core's import-time
references to ``torch.cuda._lazy_call``/``_lazy_init`` are rebound, device literals are remapped by a
TorchFunctionMode (device_remap.py), and ``"nccl"`` process groups become gloo. uninstall() restores all.
May assume: torch; megatron-core importable (imported here).
"""

from __future__ import annotations

import logging
import sys

import torch

from . import collectives, cpu_device
from .device_remap import CpuDeviceMode

# Inside the RNG tracker's fork() the "device" RNG *is* the CPU RNG on this backend, so megatron-core's
# "CPU RNG state changed within GPU RNG context" warning is expected there and says nothing.
_RNG_WARNING = "CPU RNG state changed within GPU RNG context"


class _DropRngWarning(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return _RNG_WARNING not in record.getMessage()


_state: dict = {}


def install(backend) -> None:
    if _state:
        return
    import megatron.core.tensor_parallel.random as mcore_random

    real_cuda = torch.cuda
    shim = cpu_device.build_module(real_cuda)
    _state.update(
        real_cuda=real_cuda,
        real_module=sys.modules["torch.cuda"],
        random_refs=(mcore_random._lazy_call, mcore_random._lazy_init),
        mode=CpuDeviceMode(),
        filter=_DropRngWarning(),
    )
    torch.cuda = shim
    mcore_random._lazy_call, mcore_random._lazy_init = cpu_device._lazy_call, cpu_device._lazy_init
    logging.getLogger(mcore_random.__name__).addFilter(_state["filter"])
    _state["mode"].__enter__()
    collectives.install(backend.dist_backend)


def uninstall() -> None:
    if not _state:
        return
    import megatron.core.tensor_parallel.random as mcore_random

    collectives.uninstall()
    _state["mode"].__exit__(None, None, None)
    logging.getLogger(mcore_random.__name__).removeFilter(_state["filter"])
    mcore_random._lazy_call, mcore_random._lazy_init = _state["random_refs"]
    torch.cuda = _state["real_cuda"]
    _state.clear()
