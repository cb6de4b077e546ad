"""The MUSA backend (Moore Threads GPUs through torch_musa, MCCL collectives).

May assume: nothing is installed; may import torch_musa and torchada when present (importing torch_musa
registers the "musa" device and the "mccl" collective backend; it does not create a device context).
Never infers MUSA from torch.cuda: torchada can make torch.cuda answer for MUSA devices.
Unverified here: no MUSA hardware or torch_musa is available in CI (see README's backend matrix).
"""

import importlib
import importlib.util
from dataclasses import dataclass

import torch

from .base import Backend

# Launch defaults seen on MUSA clusters (MT-MegatronLM launchers); the example scripts export these.
MUSA_ENV_DEFAULTS = {
    "MUSA_KERNEL_TIMEOUT": "3200000",
    "MCCL_PROTOS": "2",
    "MCCL_CHECK_POINTERS": "0",
    "MCCL_ALGOS": "1",
    "MCCL_BUFFSIZE": "20480000",
    "MCCL_IB_GID_INDEX": "3",
    "MUSA_BLOCK_SCHEDULE_MODE": "1",
    "CUDA_DEVICE_MAX_CONNECTIONS": "1",
    "OMP_NUM_THREADS": "4",
}


@dataclass(frozen=True)
class MusaBackend(Backend):
    def missing(self) -> str | None:
        if importlib.util.find_spec("torch_musa") is None:
            return "torch_musa is not installed (install Moore Threads' torch_musa wheel matching torch 2.7.1)"
        if importlib.util.find_spec("torchada") is None:
            return "torchada is not installed (pip install torchada): the MUSA bridge needs it"
        importlib.import_module("torch_musa")
        musa = getattr(torch, "musa", None)
        if musa is None or musa.device_count() == 0:
            return "torch_musa sees no MUSA device (check MUSA_VISIBLE_DEVICES and the driver)"
        return None


MUSA = MusaBackend(
    name="musa",
    device_type="musa",
    visible_devices_env="MUSA_VISIBLE_DEVICES",
    kernel_dispatch_key="PrivateUse1",
    bridge_module="mtmegatron.bridge.musa",
    fp8_executors=("transformer_engine", "emulated"),
)
