"""The MUSA backend (Moore Threads GPUs through torch_musa, MCCL collectives).

May assume: nothing is installed; may import torch_musa when present (importing it registers the "musa" device
and the "mccl" collective backend; it does not create a device context). torchada is only looked for here:
importing it applies its patches, which the MUSA bridge does once MUSA is chosen.
Before torch_musa is imported the visible-devices variables are synchronised (visible_devices.py), because the
MUSA runtime reads MUSA_VISIBLE_DEVICES when it loads.
Never infers MUSA from torch.cuda: torchada can make torch.cuda answer for MUSA devices.
Its answers: MT-TransformerEngine, jit fusions only with MTMEGATRON_MUSA_DYNAMO, FP8 rules from musa_device.
Unverified here: no MUSA hardware or torch_musa is available in CI (see README's backend matrix).
"""

import importlib
import importlib.util
import os
from dataclasses import dataclass

import torch

from . import musa_device, musa_runtime, visible_devices
from .base import Absent, Backend, HalfInstalled, installed_transformer_engine

# Set by the example launchers (examples/common.sh) unless the user exported a value. Only settings that are
# right on any MUSA machine: one hardware queue so megatron-core's communication/compute overlap keeps its
# order (Megatron requires it on CUDA too; MUSA's runtime reads MUSA_DEVICE_MAX_CONNECTIONS, which torchada does
# not translate, so both are set), a kernel timeout long enough for big first-step compilations and
# collectives (MT-MegatronLM's launchers; the driver default can kill long MCCL kernels), and a bounded
# OpenMP pool per rank (8 ranks per node would otherwise each take every core).
MUSA_ENV_DEFAULTS = {
    "CUDA_DEVICE_MAX_CONNECTIONS": "1",
    "MUSA_DEVICE_MAX_CONNECTIONS": "1",
    "MUSA_KERNEL_TIMEOUT": "3200000",
    "OMP_NUM_THREADS": "4",
}

# Fabric/topology tuning from Moore Threads' DeepSeek cluster launchers (MT-MegatronLM): right there, wrong
# elsewhere (MCCL_IB_GID_INDEX=3 is a RoCEv2 GID slot; ALGOS/PROTOS/BUFFSIZE pin MCCL's choices). Opt in with
# MTMEGATRON_MCCL_CLUSTER_PROFILE=mt-deepseek; a value you export still wins.
MCCL_CLUSTER_PROFILES = {
    "mt-deepseek": {
        "MCCL_PROTOS": "2",
        "MCCL_CHECK_POINTERS": "0",
        "MCCL_ALGOS": "1",
        "MCCL_BUFFSIZE": "20480000",
        "MCCL_IB_GID_INDEX": "3",
        "MUSA_BLOCK_SCHEDULE_MODE": "1",
    },
}
PROFILE_ENV = "MTMEGATRON_MCCL_CLUSTER_PROFILE"


def launch_env(environ=os.environ) -> dict[str, str]:
    """The launch defaults for this environment: universal ones plus the opted-in cluster profile (if any).
    An unknown profile name is a ValueError naming the known ones."""
    env = dict(MUSA_ENV_DEFAULTS)
    profile = environ.get(PROFILE_ENV, "")
    if profile:
        if profile not in MCCL_CLUSTER_PROFILES:
            raise ValueError(f"{PROFILE_ENV}={profile!r} is not a known MCCL cluster profile "
                             f"(known: {', '.join(sorted(MCCL_CLUSTER_PROFILES))})")
        env.update(MCCL_CLUSTER_PROFILES[profile])
    return env


INSTALL_HINT = "pip install torchada (or: bash scripts/install.sh, which installs the musa extra)"


@dataclass(frozen=True)
class MusaBackend(Backend):
    def missing(self) -> str | None:
        if not visible_devices.musa_installed():
            return Absent("torch_musa is not installed (install Moore Threads' torch_musa wheel matching your torch: "
                          "2.11.0.post1 for torch 2.11, 2.9.x for torch 2.9, 2.7.1 for torch 2.7.1)")
        if importlib.util.find_spec("torchada") is None:
            return HalfInstalled(f"torch_musa is installed but torchada is not: the MUSA bridge needs it ({INSTALL_HINT});"
                                 " to train on another backend anyway pass --backend cpu|cuda")
        visible_devices.sync()  # before torch_musa starts the MUSA runtime
        visible_devices.sync_max_connections()
        try:
            importlib.import_module("torch_musa")
        except ImportError as exc:
            return HalfInstalled(f"torch_musa is installed but fails to import: {exc}")
        musa = getattr(torch, "musa", None)
        if musa is None or musa.device_count() == 0:
            return "torch_musa sees no MUSA device (check MUSA_VISIBLE_DEVICES and the driver)"
        return None

    def transformer_engine_missing(self) -> str | None:
        return {"mt": None, None: "MT-TransformerEngine is not installed"}.get(
            installed_transformer_engine(),
            "the installed transformer_engine is NVIDIA's build, not MT-TransformerEngine (no musa package)")

    def fusions_missing(self) -> dict[str, str]:
        missing = {"apex": "apex's kernels are CUDA kernels"}
        if not musa_runtime.dynamo_requested():
            missing["jit"] = f"TorchDynamo is off on MUSA ({musa_runtime.ENV_VAR}=1 turns it on)"
        return missing

    def attention_kernel(self, dtype: torch.dtype, head_dim: int, masked: bool = False) -> str:
        return "musa_flash" if dtype in (torch.float16, torch.bfloat16) else "math"

    def scaled_mm_rules(self, facts) -> tuple[str | None, str | None]:
        if facts.capability is None:
            why = "the MUSA arch is unknown (torch.musa has no get_device_capability)"
            return why, why
        arch = musa_device.arch_number(facts.capability)
        if not musa_device.supports_scaled_mm(arch):
            why = (f"MUSA arch {arch} < {musa_device.SCALED_MM_MIN_ARCH}: torch_musa runs _scaled_mm from the S5000 "
                   "(arch 310) on")
            return why, why
        return None, "torch_musa's _scaled_mm takes tensor- and row-wise scales only"

    check_precision_args = staticmethod(musa_device.check_precision_args)
    capability_lines = staticmethod(musa_device.capability_lines)


MUSA = MusaBackend(
    name="musa",
    device_type="musa",
    visible_devices_env="MUSA_VISIBLE_DEVICES",
    kernel_dispatch_key="PrivateUse1",
    bridge_module="mtmegatron.bridge.musa",
    fp8_executors=("transformer_engine", "scaled_mm", "emulated"),  # scaled_mm: musa_device.SCALED_MM_MIN_ARCH
    profiler_activity="PrivateUse1",
)
