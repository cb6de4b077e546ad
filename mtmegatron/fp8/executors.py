"""FP8 GEMM executors and their selection per backend.

Every GEMM here is ``A @ B^T`` with both operands quantized along their last (contraction) dimension, so
forward (X W^T), dgrad (dY (W^T)^T) and wgrad (dY^T (X^T)^T) all take one shape. Executors:
- ``scaled_mm``: one ``torch._scaled_mm`` per GEMM where the backend's rules and the probe allow it (probe.py).
  Per-tensor scales go straight in (fp32 output); DeepSeek-V3 block scales (1x128 tiles x 128x128 blocks, or
  1x128 x 1x128 for wgrad) go to ``torch.nn.functional.scaled_mm`` in one call where the backend's rules allow
  block scales on the tensors' device. Elsewhere a block-scaled recipe (blockwise, mxfp8) is resolved to ``emulated`` and
  the start-up line says so (fp8/spec.py).
- ``emulated``: dequantize both operands to fp32 and multiply: the float reference every other executor is
  checked against.
- ``transformer_engine``: TransformerEngine (CUDA) or MUSA's TransformerEngine; it is not a GEMM function here:
  it swaps in megatron-core's TE layer spec (see spec.py).
May assume: torch >= 2.7; ``torch._scaled_mm`` may be missing or refuse a device (then it is not offered).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from mtmegatron.backends.registry import backend_for

from .quantize import fp8_dequantize

EXECUTORS = ("transformer_engine", "scaled_mm", "emulated")


@dataclass(frozen=True)
class QTensor:
    """FP8 data plus its dequantization scale: a single value (``block`` None) or one per ``block``."""

    data: torch.Tensor
    scale_inv: torch.Tensor
    block: tuple[int, int] | None = None

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        rows, cols = self.block or (1, 1)
        return fp8_dequantize(self.data, self.scale_inv, rows, cols, dtype)

    def t(self) -> "QTensor":
        """The transpose; only per-tensor or square-block scaling stays valid along the other dimension."""
        assert self.block is None or self.block[0] == self.block[1], "1-D blocks must be re-quantized, not transposed"
        grid = self.scale_inv if self.block is None else self.scale_inv.t().contiguous()
        return QTensor(self.data.t().contiguous(), grid, self.block)


def gemm_emulated(a: QTensor, b: QTensor) -> torch.Tensor:
    return a.dequantize() @ b.dequantize().t()


def _column_major(t: torch.Tensor) -> torch.Tensor:
    return t.t().contiguous().t()


# torch >= 2.10 has the block-scaled functional GEMM; the floor (2.7) does not
HAS_BLOCK_SCALED_MM = hasattr(F, "scaled_mm") and hasattr(getattr(F, "ScalingType", None), "BlockWise1x128")


@functools.cache
def block_scales_run(device: torch.device) -> bool:
    """Whether this torch has ``torch.nn.functional.scaled_mm`` and the backend's rules let it take block scales on
    ``device``."""
    return HAS_BLOCK_SCALED_MM and (backend := backend_for(device.type)).scaled_mm_rules(backend.facts())[1] is None


def block_scaled_shape_fits(a: QTensor, b: QTensor) -> bool:
    """What ``gemm_scaled_mm_blockwise`` takes: A in 1x128 tiles, B in 128x128 blocks or 1x128 tiles, both E4M3
    (torch 2.11 on an H200 refuses an E5M2 operand with block scales: the hybrid format's gradients run emulated),
    K a multiple of 128 and M, N multiples of 16 (cuBLAS alignment)."""
    return (a.block == (1, 128) and b.block in ((128, 128), (1, 128)) and a.data.shape[1] % 128 == 0
            and a.data.shape[0] % 16 == 0 and b.data.shape[0] % 16 == 0
            and a.data.dtype == b.data.dtype == torch.float8_e4m3fn)


def gemm_scaled_mm_blockwise(a: QTensor, b: QTensor) -> torch.Tensor:
    """One block-scaled GEMM (torch's cuBLAS layouts: the 1x128 scales of A as [M, K/128] column-major; 128x128
    scales of B as [K/128 rounded up to 4, N/128] column-major, or its 1x128 scales as [N, K/128] column-major)."""
    recipe = F.ScalingType
    num_k_blocks = a.scale_inv.shape[1]
    scale_a = _column_major(a.scale_inv.float())
    if b.block == (128, 128):
        padded = -(-num_k_blocks // 4) * 4
        scale_b = F.pad(b.scale_inv.float(), (0, padded - num_k_blocks)).contiguous().t()
        recipe_b = recipe.BlockWise128x128
    else:
        scale_b, recipe_b = _column_major(b.scale_inv.float()), recipe.BlockWise1x128
    return F.scaled_mm(a.data, b.data.t(), scale_a, recipe.BlockWise1x128, scale_b, recipe_b,
                       output_dtype=torch.float32)


def gemm_scaled_mm(a: QTensor, b: QTensor) -> torch.Tensor:
    if a.block is None and b.block is None:
        return torch._scaled_mm(a.data, b.data.t(), scale_a=a.scale_inv.float().reshape(()),
                                scale_b=b.scale_inv.float().reshape(()), out_dtype=torch.float32)
    if block_scales_run(a.data.device) and block_scaled_shape_fits(a, b):
        return gemm_scaled_mm_blockwise(a, b)
    return gemm_emulated(a, b)  # elsewhere, or a shape the block-scaled kernel does not take (e.g. K % 128)


GEMMS = {"scaled_mm": gemm_scaled_mm, "emulated": gemm_emulated}

