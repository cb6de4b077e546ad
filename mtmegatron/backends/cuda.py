"""The CUDA backend (NVIDIA GPUs, NCCL collectives); its answers: NVIDIA's TransformerEngine, apex, FlashAttention-2
and the memory-efficient kernel, FP8 ``_scaled_mm`` from sm89 (block scales: sm90, cuBLAS >= 12.9), nsys.
May assume: torch; may call torch.cuda.device_count (no context is created by it). Must not: initialise CUDA.
"""

import importlib.util
from dataclasses import dataclass

import torch

from .base import Absent, Backend, installed_transformer_engine

CUDA_MIN_CAPABILITY = (8, 9)
BLOCK_SCALED_MM_CAPABILITY_MAJOR = 9
BLOCK_SCALED_MM_MIN_CUBLAS = (12, 9)
FLASH_MAX_HEAD_DIM = 256
HALF = (torch.float16, torch.bfloat16)


@dataclass(frozen=True)
class CudaBackend(Backend):
    def missing(self) -> str | None:
        if torch.version.cuda is None:
            return Absent(f"this torch ({torch.__version__}) was built without CUDA")
        if torch.cuda.device_count() == 0:
            return "no CUDA device is visible (check CUDA_VISIBLE_DEVICES and the driver)"
        return None

    def transformer_engine_missing(self) -> str | None:
        return None if installed_transformer_engine() else \
            "TransformerEngine is not installed (pip install transformer-engine[pytorch])"

    def fusions_missing(self) -> dict[str, str]:
        return {} if importlib.util.find_spec("apex") else {"apex": "apex is not installed"}

    def attention_kernel(self, dtype: torch.dtype, head_dim: int, masked: bool = False) -> str:
        if dtype in HALF and head_dim <= FLASH_MAX_HEAD_DIM and not masked:
            return "cuda_flash"
        return "cuda_efficient" if dtype in (torch.float32,) + HALF else "math"

    def scaled_mm_rules(self, facts) -> tuple[str | None, str | None]:
        cap = facts.capability
        if cap is None or cap < CUDA_MIN_CAPABILITY:
            why = f"compute capability {cap} < 8.9: FP8 GEMMs need Ada, Hopper or newer"
            return why, why
        if cap[0] != BLOCK_SCALED_MM_CAPABILITY_MAJOR:
            return None, f"torch's 1x128/128x128 block-scaled GEMM runs on sm90 only (this is sm{cap[0]}{cap[1]})"
        if facts.cuda_version is None or facts.cuda_version < BLOCK_SCALED_MM_MIN_CUBLAS:
            return None, f"block scales need cuBLAS >= 12.9 (torch built with CUDA {facts.cuda_version})"
        if not facts.has_block_scaled_mm:
            return None, "block scales need torch.nn.functional.scaled_mm (torch >= 2.10)"
        return None, None


CUDA = CudaBackend(
    name="cuda",
    device_type="cuda",
    visible_devices_env="CUDA_VISIBLE_DEVICES",
    kernel_dispatch_key="CUDA",
    bridge_module="mtmegatron.bridge.cuda",
    fp8_executors=("transformer_engine", "scaled_mm", "emulated"),
    profiler_activity="CUDA",
    nsys_range=True,
)
