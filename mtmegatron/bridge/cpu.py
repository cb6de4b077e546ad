"""CPU bridge: makes unmodified megatron-core run on the host with gloo collectives.

install(): ``torch.cuda`` becomes the CPU device module (cpu_device.py), megatron-core's import-time
references to ``torch.cuda._lazy_call``/``_lazy_init`` are rebound, device literals are remapped by a
TorchFunctionMode (device_remap.py), and ``"nccl"`` process groups become gloo. uninstall() restores all.
May assume: torch; megatron-core importable (imported here).
"""

from __future__ import annotations

import importlib
import logging

import torch

from . import collectives, cpu_device, device_remap
from .megatron_bindings import LAZY_CALL_MODULES

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
    problem = device_remap.supported()
    if problem:
        raise RuntimeError(problem)
    # their import-time _lazy_call/_lazy_init would queue RNG state changes until CUDA initialises, which never
    # happens on this backend (the changes would be silently dropped)
    lazy_modules = [importlib.import_module(name) for name in LAZY_CALL_MODULES]
    real_cuda = torch.cuda
    _state.update(
        real_cuda=real_cuda,
        lazy_refs=[(m, m._lazy_call, m._lazy_init) for m in lazy_modules],
        mode=device_remap.CpuDeviceMode(),
        filter=_DropRngWarning(),
    )
    torch.cuda = cpu_device.build_module(real_cuda)
    for module in lazy_modules:
        module._lazy_call, module._lazy_init = cpu_device._lazy_call, cpu_device._lazy_init
    logging.getLogger(LAZY_CALL_MODULES[0]).addFilter(_state["filter"])
    _state["mode"].__enter__()
    _state["restore_engine"] = device_remap.engine_under_mode(_state["mode"])
    collectives.install(backend.dist_backend)


def uninstall() -> None:
    if not _state:
        return
    collectives.uninstall()
    if _state["restore_engine"] is not None:
        _state["restore_engine"]()
    _state["mode"].__exit__(None, None, None)
    logging.getLogger(LAZY_CALL_MODULES[0]).removeFilter(_state["filter"])
    for module, lazy_call, lazy_init in _state["lazy_refs"]:
        module._lazy_call, module._lazy_init = lazy_call, lazy_init
    torch.cuda = _state["real_cuda"]
    _state.clear()
