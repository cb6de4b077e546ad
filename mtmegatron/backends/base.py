"""The Backend description: what mtmegatron needs to know about one accelerator family.

A backend is data plus a few cheap queries, never a wrapper around torch: device APIs come from
``torch.get_device_module(device_type)``, ``torch.Stream``/``torch.Event`` and ``torch.accelerator``.
May assume: torch is importable. Must not: create a device context at import time or in ``is_available``.
"""

from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass

import torch


class BackendUnavailableError(ValueError):
    """A backend was requested that this machine cannot provide; the message says what is missing."""


class Absent(str):
    """A ``missing()`` reason meaning the backend's software is not on this machine at all: auto-detect passes
    over it quietly (a CUDA box has no torch_musa, and that is normal)."""


class HalfInstalled(str):
    """A ``missing()`` reason meaning the backend is partly installed (e.g. torch_musa without torchada): auto-detect
    stops with this error instead of quietly picking the next backend. The text names the fix."""


@dataclass(frozen=True)
class Backend:
    """One accelerator family.

    name:                 what users type after ``--backend``.
    device_type:          torch device type that tensors live on ("cpu", "cuda", "musa").
    visible_devices_env:  env var that restricts visible devices (None for cpu).
    kernel_dispatch_key:  dispatch key our native kernels register under ("CPU", "CUDA", "PrivateUse1").
    bridge_module:        module whose ``install()``/``uninstall()`` make megatron-core's CUDA calls
                          resolve to this backend.
    fp8_executors:        FP8 executors this backend may offer, in order of preference.
    """

    name: str
    device_type: str
    visible_devices_env: str | None
    kernel_dispatch_key: str
    bridge_module: str
    fp8_executors: tuple[str, ...] = ("emulated",)

    def missing(self) -> str | None:
        """Why this backend cannot run here, or None when it can. Subclasses override; cached by callers.
        A plain str is reported when auto-detect skips the backend; ``Absent``/``HalfInstalled`` (see above)
        make auto-detect skip quietly / stop with an error."""
        return None

    def is_available(self) -> bool:
        return _cached_missing(self) is None

    def require(self) -> "Backend":
        """Return self, or raise BackendUnavailableError naming what is missing."""
        reason = _cached_missing(self)
        if reason is not None:
            raise BackendUnavailableError(f"{self.name} requested but {reason}")
        return self

    @property
    def dist_backend(self) -> str:
        """Collective library for this device type, as torch.distributed has it registered."""
        registry = torch.distributed.Backend.default_device_backend_map
        if self.device_type not in registry:
            raise BackendUnavailableError(
                f"torch.distributed has no collective backend registered for device '{self.device_type}'"
                f" (registered: {dict(registry)})"
            )
        return registry[self.device_type]

    def device_module(self):
        return torch.get_device_module(self.device_type)

    def device(self, local_rank: int = 0) -> torch.device:
        if self.device_type == "cpu":
            return torch.device("cpu")
        return torch.device(self.device_type, local_rank)

    def set_device(self, local_rank: int) -> None:
        if self.device_type != "cpu":
            self.device_module().set_device(local_rank)

    def bridge(self):
        """The bridge module for this backend (see mtmegatron.bridge)."""
        return importlib.import_module(self.bridge_module)


@functools.cache
def _cached_missing(backend: Backend) -> str | None:
    return backend.missing()
