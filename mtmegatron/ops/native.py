"""Loading of the native kernel libraries and questions about what they provide.

Importing `mtmegatron._C` runs its static TORCH_LIBRARY_IMPL registrations (CPU always; CUDA when built with
nvcc). The MUSA kernels are a separate extension, `mtmegatron._musa_kernels` (musa_build.py), registering
PrivateUse1. A failed import is not fatal (every op then runs its Python reference) but it is never silent:
the error is kept, `status(device_type)` puts it in the one line that `mtmegatron env` and the pretrain start-up
print, and a MUSA extension that fails to import on a MUSA machine is also a warning at load time.
May assume: torch is importable; no device context is created.
"""
from __future__ import annotations

import importlib
import warnings

import torch

from mtmegatron.backends.musa import MUSA
from mtmegatron.backends.registry import backend_for

NATIVE_LOADED: bool = False
LOAD_ERROR: str | None = None
BUILD_INFO: dict = {}

MUSA_EXTENSION = "mtmegatron._musa_kernels"
MUSA_LOADED: bool = False
MUSA_LOAD_ERROR: str | None = None

_PROBE_OP = "mtmegatron::rms_norm"


def load() -> bool:
    """Import mtmegatron._C (idempotent). Returns whether it loaded; on failure LOAD_ERROR says why."""
    global NATIVE_LOADED, LOAD_ERROR, BUILD_INFO
    if NATIVE_LOADED:
        return True
    try:
        module = importlib.import_module("mtmegatron._C")
    except ImportError as exc:  # built without the extension, or an ABI mismatch: the references serve
        LOAD_ERROR = f"{type(exc).__name__}: {exc}"
        return False
    NATIVE_LOADED, LOAD_ERROR = True, None
    BUILD_INFO = dict(getattr(module, "build_info", {}))
    return True


def _musa_is_registered() -> bool:
    """Whether torch_musa (or a stand-in) has named the PrivateUse1 device "musa" in this process."""
    return torch._C._get_privateuse1_backend_name() == MUSA.device_type


def load_musa_extension(module_name: str = MUSA_EXTENSION) -> bool:
    """Import the MUSA kernel extension built by musa_build.py (idempotent). Unverified (no MUSA here).

    On failure MUSA_LOAD_ERROR keeps the reason; when the "musa" device is registered in this process the
    failure is also a warning, since the fused ops will silently be slower otherwise."""
    global MUSA_LOADED, MUSA_LOAD_ERROR
    if MUSA_LOADED:
        return True
    try:
        importlib.import_module(module_name)
    except ImportError as exc:
        if isinstance(exc, ModuleNotFoundError) and exc.name == module_name:
            MUSA_LOAD_ERROR = f"{module_name} is not built (run: python -m mtmegatron.ops.musa_build)"
        else:
            MUSA_LOAD_ERROR = f"{module_name} failed to import: {type(exc).__name__}: {exc}"
        if _musa_is_registered():
            warnings.warn(f"mtmegatron: MUSA fused ops run their Python reference: {MUSA_LOAD_ERROR}", stacklevel=2)
        return False
    MUSA_LOADED, MUSA_LOAD_ERROR = True, None
    return True


def native_available(device: torch.device | str, op: str = _PROBE_OP) -> bool:
    """True when a native (C++/CUDA/MUSA) kernel of `op` is registered for the device's dispatch key;
    False means the op runs its Python reference there."""
    device_type = device if isinstance(device, str) and ":" not in device else torch.device(device).type
    return torch._C._dispatch_has_kernel_for_dispatch_key(op, backend_for(device_type).kernel_dispatch_key)


def status(device_type: str) -> str:
    """One line for logs: do native kernels serve ``device_type``, and if not, why."""
    key = backend_for(device_type).kernel_dispatch_key
    if key == "PrivateUse1" and not MUSA_LOADED:
        load_musa_extension()  # torch_musa may have been imported after mtmegatron.ops
    if native_available(device_type):
        source = MUSA_EXTENSION if key == "PrivateUse1" else "mtmegatron._C"
        return f"native kernels on {device_type}: yes ({source})"
    if key == "PrivateUse1":
        why = MUSA_LOAD_ERROR or f"{MUSA_EXTENSION} registers no {key} kernel for {_PROBE_OP}"
    elif not NATIVE_LOADED:
        why = f"mtmegatron._C failed to load: {LOAD_ERROR}"
    else:
        why = f"mtmegatron._C was built without {key} kernels (build {BUILD_INFO})"
    return f"native kernels on {device_type}: no, fused ops run their Python reference ({why})"
