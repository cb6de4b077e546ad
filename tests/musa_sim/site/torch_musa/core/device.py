"""Device selection and properties of the simulated MUSA devices (``torch.musa.device_count`` & co)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from .._ext import ext
from ._utils import _get_musa_device_index

_TOTAL_MEMORY = int(float(os.environ.get("MUSA_SIM_MEMORY_GIB", "48")) * 2**30)
# the simulated arch: "2.2" (an S4000, the default) or e.g. "2.1" (an S80: no bf16) / "3.1" (an S5000)
_MAJOR, _MINOR = (int(x) for x in os.environ.get("MUSA_SIM_CAPABILITY", "2.2").split("."))
_NAMES = {(2, 1): "MTT S80", (2, 2): "MTT S4000", (3, 1): "MTT S5000"}


def device_count() -> int:
    return ext.device_count()


def is_available() -> bool:
    return ext.device_count() > 0


def current_device() -> int:
    return ext.current_device()


def set_device(device) -> None:
    index = _get_musa_device_index(device)
    if index >= 0:
        ext.set_device(index)


def synchronize(device=None) -> None:
    """Everything on the simulated device is synchronous; validates the device like the real call."""
    _get_musa_device_index(device)


class device:
    """Context manager that makes ``device`` current for its body (``torch.musa.device(i)``)."""

    def __init__(self, device):
        self.index = _get_musa_device_index(device, optional=True, allow_cpu=True)
        self.previous = -1

    def __enter__(self):
        self.previous = ext.current_device()
        if self.index >= 0:
            ext.set_device(self.index)
        return self

    def __exit__(self, *exc):
        ext.set_device(self.previous)
        return False


class device_of(device):
    def __init__(self, obj):
        super().__init__(obj.get_device() if obj.device.type == "musa" else -1)


@dataclass(frozen=True)
class _DeviceProperties:
    name: str
    major: int
    minor: int
    total_memory: int
    multi_processor_count: int
    warp_size: int
    is_integrated: bool = False
    gcnArchName: str = "mp_22"


def get_device_properties(device=None) -> _DeviceProperties:
    _get_musa_device_index(device)
    name = _NAMES.get((_MAJOR, _MINOR), f"MUSA {_MAJOR}.{_MINOR}")
    return _DeviceProperties(f"{name} (musa_sim)", _MAJOR, _MINOR, _TOTAL_MEMORY, 128, 128)


def get_device_name(device=None) -> str:
    return get_device_properties(device).name


def get_device_capability(device=None) -> tuple[int, int]:
    props = get_device_properties(device)
    return props.major, props.minor


def get_arch_list() -> list[str]:
    return ["mp_22"]


def _is_compiled() -> bool:
    return True
