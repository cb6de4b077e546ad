"""The CUDA backend (NVIDIA GPUs, NCCL collectives).

May assume: torch; may call torch.cuda.device_count (no context is created by it). Must not: initialise CUDA.
"""

from dataclasses import dataclass

import torch

from .base import Absent, Backend


@dataclass(frozen=True)
class CudaBackend(Backend):
    def missing(self) -> str | None:
        if torch.version.cuda is None:
            return Absent(f"this torch ({torch.__version__}) was built without CUDA")
        if torch.cuda.device_count() == 0:
            return "no CUDA device is visible (check CUDA_VISIBLE_DEVICES and the driver)"
        return None


CUDA = CudaBackend(
    name="cuda",
    device_type="cuda",
    visible_devices_env="CUDA_VISIBLE_DEVICES",
    kernel_dispatch_key="CUDA",
    bridge_module="mtmegatron.bridge.cuda",
    fp8_executors=("transformer_engine", "scaled_mm", "emulated"),
)
