"""Loading of the native kernel library `mtmegatron._C` and questions about what it provides.

Importing `mtmegatron._C` runs its static TORCH_LIBRARY_IMPL registrations (CPU always; CUDA when built with
nvcc; the MUSA build registers PrivateUse1 from a separate extension, see musa_build.py). A failed import is not
an error: every op then runs its Python reference. May assume: torch is importable; no device context is created.
"""
from __future__ import annotations

import importlib

import torch

NATIVE_LOADED: bool = False
LOAD_ERROR: str | None = None
BUILD_INFO: dict = {}

_PROBE_OP = "mtmegatron::rms_norm"


def load() -> bool:
    """Import mtmegatron._C (idempotent). Returns whether it loaded."""
    global NATIVE_LOADED, LOAD_ERROR, BUILD_INFO
    if NATIVE_LOADED:
        return True
    try:
        module = importlib.import_module("mtmegatron._C")
    except ImportError as exc:  # built without the extension, or an ABI mismatch: fall back to the references
        LOAD_ERROR = str(exc)
        return False
    NATIVE_LOADED = True
    BUILD_INFO = dict(getattr(module, "build_info", {}))
    return True


def load_musa_extension(module_name: str = "mtmegatron_musa_kernels") -> bool:
    """Import the separately built MUSA kernel extension (musa_build.py), if present. Unverified (no MUSA here)."""
    try:
        importlib.import_module(module_name)
    except ImportError:
        return False
    return True


def _dispatch_key(device_type: str) -> str:
    if device_type == "cpu":
        return "CPU"
    if device_type == "cuda":  # the dispatch key name, not a device API
        return "CUDA"
    return "PrivateUse1"


def native_available(device: torch.device | str, op: str = _PROBE_OP) -> bool:
    """True when a native (C++/CUDA/MUSA) kernel of `op` is registered for the device's dispatch key;
    False means the op runs its Python reference there."""
    device_type = torch.device(device).type
    return torch._C._dispatch_has_kernel_for_dispatch_key(op, _dispatch_key(device_type))
