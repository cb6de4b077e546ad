"""MUSA bridge: Moore Threads' torchada makes ``torch.cuda.*``, ``tensor.cuda()`` and ``device='cuda'``
resolve to torch_musa; ``"nccl"`` process groups become ``"mccl"``.

What torchada leaves to us (each found on the simulated MUSA device, tests/musa_sim):
- ``Tensor.type()`` of a MUSA tensor is ``'torch.musa.FloatTensor'``, but megatron-core compares it with
  ``'torch.cuda.FloatTensor'`` (grad clipping, both optimizers): the no-argument form reports the CUDA name.
- megatron-core binds ``torch.cuda`` names at import (``_lazy_call``/``_lazy_init``/``device`` in the RNG
  tracker, the legacy ``torch.cuda.*Tensor`` types ``Float16Module`` uses to cast outputs back to fp32). If
  megatron-core was imported before torchada, those still name the real CUDA module: RNG seeding is queued
  forever and bf16 outputs stay bf16. They are re-bound to the redirected names here, whatever the import order.
- TF32 for fp32 GEMMs follows Megatron-LM's CUDA behaviour (backends/musa_device.apply_tf32_rule).
May assume: torch_musa and torchada are installed (the musa backend checks before this runs).
torchada's own patches cannot be undone, so uninstall() restores only what this module changed.
"""

from __future__ import annotations

import sys

import torch
import torchada  # noqa: F401 - imports torch_musa and applies torchada's patches; before megatron-core (activate)

from mtmegatron.backends import musa_device, musa_runtime

from . import collectives
from .megatron_bindings import LAZY_CALL_MODULES

# the name each LAZY_CALL_MODULES module binds -> the torch.cuda name it took
_IMPORT_TIME_NAMES = {"_lazy_call": "_lazy_call", "_lazy_init": "_lazy_init", "device_ctx_manager": "device"}
# megatron.core.transformer.module: (name, host legacy type, accelerator legacy type name)
_LEGACY_TYPE_TUPLES = (("_FLOAT_TYPES", torch.FloatTensor, "FloatTensor"),
                       ("_HALF_TYPES", torch.HalfTensor, "HalfTensor"),
                       ("_BF16_TYPES", torch.BFloat16Tensor, "BFloat16Tensor"))
_MUSA_TYPE_PREFIX = "torch.musa."
_CUDA_TYPE_PREFIX = "torch.cuda."

_state: dict = {}


def _type_with_cuda_names(original):
    def type(self, dtype=None, non_blocking=False, **kwargs):  # noqa: A001 - mirrors Tensor.type
        if dtype is None and not kwargs:
            name = original(self)
            if name.startswith(_MUSA_TYPE_PREFIX):
                return _CUDA_TYPE_PREFIX + name[len(_MUSA_TYPE_PREFIX):]
            return name
        return original(self, dtype, non_blocking, **kwargs)

    type.__wrapped__ = original
    return type


def _rebind(module, name, value) -> None:
    _state["rebound"].append((module, name, getattr(module, name)))
    setattr(module, name, value)


def _rebind_megatron_import_time_names() -> None:
    """Point megatron-core's import-time ``torch.cuda`` bindings at the redirected module (modules not yet
    imported need nothing: they will bind the redirected names themselves)."""
    for module_name in LAZY_CALL_MODULES:
        module = sys.modules.get(module_name)
        if module is not None:
            for attr, cuda_name in _IMPORT_TIME_NAMES.items():
                _rebind(module, attr, getattr(torch.cuda, cuda_name))
    module = sys.modules.get("megatron.core.transformer.module")
    if module is not None:
        for attr, host_type, legacy_name in _LEGACY_TYPE_TUPLES:
            _rebind(module, attr, (host_type, getattr(torch.cuda, legacy_name)))


def install(backend) -> None:
    if _state:
        return
    _state["rebound"] = []
    _state["tensor_type"] = torch.Tensor.type
    torch.Tensor.type = _type_with_cuda_names(torch.Tensor.type)
    _rebind_megatron_import_time_names()
    musa_runtime.disable_dynamo_unless_requested()  # megatron-core's jit_fuser would send work to inductor
    musa_device.apply_tf32_rule()  # fp32 GEMMs: full FP32 unless TF32 is asked for, as on CUDA
    collectives.install(backend.dist_backend)


def uninstall() -> None:
    if not _state:
        return
    collectives.uninstall()
    musa_runtime.restore()
    musa_device.restore_tf32()
    for module, name, value in reversed(_state["rebound"]):
        setattr(module, name, value)
    torch.Tensor.type = _state["tensor_type"]
    _state.clear()
