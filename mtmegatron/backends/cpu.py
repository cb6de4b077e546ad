"""The CPU backend: a real backend (gloo collectives, CPU kernels), used to debug and test the whole stack.

Its device is the host. Fusions run here only where measured faster or equal (``benchmarks/step.py --fusion-ab``;
the figures in docs/flags.md): megatron-core's jit fusions and our fused RoPE were not; each switch below (=1)
turns one on.
May assume: nothing beyond torch. Always available.
"""

import os
from dataclasses import dataclass

import torch

from .base import Backend

CPU_JIT_ENV = "MTMEGATRON_CPU_JIT_FUSIONS"
CPU_JIT_WHY = ("megatron-core's jit fusions are off on cpu: not measured faster there (compile cost at start-up; "
               "docs/flags.md)")
CPU_ROPE_ENV = "MTMEGATRON_CPU_ROPE_FUSION"
CPU_ROPE_WHY = "ours measured no faster than unfused RoPE on cpu (docs/flags.md)"


@dataclass(frozen=True)
class CpuBackend(Backend):
    def fusions_missing(self) -> dict[str, str]:
        missing = {"apex": "apex has no kernels here"}
        if os.environ.get(CPU_JIT_ENV) != "1":
            missing["jit"] = f"{CPU_JIT_WHY} ({CPU_JIT_ENV}=1 turns them on)"
        if os.environ.get(CPU_ROPE_ENV) != "1":
            missing["rope"] = f"{CPU_ROPE_WHY}; {CPU_ROPE_ENV}=1 turns it on"
        return missing

    def attention_kernel(self, dtype: torch.dtype, head_dim: int, masked: bool = False) -> str:
        """torch's CPU flash kernel (aten::_scaled_dot_product_flash_attention_for_cpu; GQA native)."""
        return "cpu_flash" if dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16) else "math"

    def scaled_mm_rules(self, facts) -> tuple[str | None, str | None]:
        return None, "torch's CPU _scaled_mm takes no 1x128/128x128 block scales"


CPU = CpuBackend(
    name="cpu",
    device_type="cpu",
    visible_devices_env=None,
    kernel_dispatch_key="CPU",
    bridge_module="mtmegatron.bridge.cpu",
    fp8_executors=("scaled_mm", "emulated"),
    device_is_host=True,
)
