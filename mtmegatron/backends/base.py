"""The Backend description: what mtmegatron needs to know about one accelerator family.

A backend is data plus a few cheap queries, never a wrapper around torch: device APIs come from
``torch.get_device_module(device_type)``, ``torch.Stream``/``torch.Event`` and ``torch.accelerator``.
May assume: torch is importable. Must not: create a device context at import time or in ``is_available``.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os
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
    device_is_host:       the device is the host (no allocator, device RNG, pinned memory; init on the host).
    profiler_activity / nsys_range: the device's torch.profiler activity; whether ``--profile`` opens an nsys range.
    The methods answer for a device nothing is known about; cpu.py, cuda.py and musa.py override them.
    """

    name: str
    device_type: str
    visible_devices_env: str | None
    kernel_dispatch_key: str
    bridge_module: str
    fp8_executors: tuple[str, ...] = ("emulated",)
    device_is_host: bool = False
    profiler_activity: str | None = None
    nsys_range: bool = False

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
        return torch.device(self.device_type) if self.device_is_host else torch.device(self.device_type, local_rank)

    def set_device(self, local_rank: int) -> None:
        if not self.device_is_host:
            self.device_module().set_device(local_rank)

    def transformer_engine_missing(self) -> str | None:
        """Why no TransformerEngine serves this backend's layers (None: one does)."""
        return f"TransformerEngine has no layers for the {self.device_type} backend"

    def fusions_missing(self) -> dict[str, str]:
        """Why a fusion family does not run here: "jit" (torch.compile'd), "apex", "rope" (ours); unnamed: runs."""
        return {"jit": f"megatron-core's jit fusions are not compiled on the {self.device_type} backend",
                "apex": "apex has no kernels here"}

    def attention_kernel(self, dtype: torch.dtype, head_dim: int, masked: bool = False) -> str:
        """The attention kernel (attention/blocks.py names them) for ``dtype``, ``head_dim`` and masking."""
        return "math"

    def scaled_mm_rules(self, facts: "DeviceFacts") -> tuple[str | None, str | None]:
        """Why ``torch._scaled_mm`` runs no (tensor-wise, block-scaled) GEMM on that device, by rule (None: may)."""
        return None, f"no block-scaled GEMM known for {self.device_type}"

    def check_precision_args(self, args, error) -> None:
        """Refuse (``raise error(...)``) flags this backend's devices cannot run, before any process group."""

    def capability_lines(self) -> list[str]:
        """What ``mtmegatron env`` prints about this machine's devices beyond their number."""
        return []

    def facts(self) -> "DeviceFacts":
        """The facts of this backend's current device (set the rank's device first)."""
        if self.device_is_host:
            return DeviceFacts(self.device_type, has_block_scaled_mm=has_block_scaled_mm())
        module = self.device_module()
        index, capability = module.current_device(), getattr(module, "get_device_capability", None)
        cuda = tuple(int(part) for part in torch.version.cuda.split(".")[:2]) if torch.version.cuda else None
        return DeviceFacts(self.device_type, index, capability and tuple(capability(index)), cuda,
                           has_block_scaled_mm())

    def bridge(self):
        """The bridge module for this backend (see mtmegatron.bridge)."""
        return importlib.import_module(self.bridge_module)


@dataclass(frozen=True)
class DeviceFacts:
    """What the FP8 GEMM rules need to know about the running device."""

    device_type: str
    index: int | None = None                    # the current device (None on the host)
    capability: tuple[int, int] | None = None   # CUDA compute capability / MUSA (major, minor)
    cuda_version: tuple[int, int] | None = None  # the CUDA (and cuBLAS) torch was built with
    has_block_scaled_mm: bool = False           # torch.nn.functional.scaled_mm with ScalingType.BlockWise1x128

    @property
    def device(self) -> torch.device:
        return torch.device(self.device_type, self.index)


def has_block_scaled_mm() -> bool:  # torch >= 2.10 (the MUSA path's floor is 2.7: tests/test_torch_floor.py)
    return hasattr(torch.nn.functional, "scaled_mm") and hasattr(getattr(torch.nn.functional, "ScalingType", None),
                                                                 "BlockWise1x128")


def installed_transformer_engine() -> str | None:
    """Which TransformerEngine is installed, found on disk (nothing imported): "mt" for Moore Threads'
    MT-TransformerEngine (it keeps the import name and adds a ``musa`` package), "nvidia", or None."""
    spec = importlib.util.find_spec("transformer_engine")
    if spec is None:
        return None
    mt = any(os.path.isdir(os.path.join(path, "musa")) for path in spec.submodule_search_locations or ())
    return "mt" if mt else "nvidia"


@functools.cache
def _cached_missing(backend: Backend) -> str | None:
    return backend.missing()
