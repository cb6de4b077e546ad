"""FP8 GEMM executors and their selection per backend.

Every GEMM here is ``A @ B^T`` with both operands quantized along their last (contraction) dimension, so
forward (X W^T), dgrad (dY (W^T)^T) and wgrad (dY^T (X^T)^T) all take one shape. Executors:
- ``scaled_mm``: ``torch._scaled_mm`` (CPU in torch >= 2.13, Hopper+ CUDA). Per-tensor scales go straight in;
  block scales (blockwise, mxfp8) run as one row-wise-scaled ``_scaled_mm`` per contraction block, summed in
  fp32, because ``_scaled_mm`` on the CPU accepts only tensor-wise and row-wise scales.
- ``emulated``: dequantize both operands to fp32 and multiply: the float reference every other executor is
  checked against.
- ``transformer_engine``: TransformerEngine (CUDA) or MUSA's TransformerEngine; it is not a GEMM function here:
  it swaps in megatron-core's TE layer spec (see spec.py).
``select_executor`` takes the first executor of ``Backend.fp8_executors`` that can run.
May assume: torch >= 2.7; ``torch._scaled_mm`` may be missing or refuse a device (then it is not offered).
"""

from __future__ import annotations

import functools
import importlib.util
from dataclasses import dataclass

import torch

from .quantize import expand_blocks, fp8_dequantize

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


def _row_scales(q: QTensor) -> torch.Tensor:
    """[rows, num_k_blocks] fp32 dequantization scale of every row's contraction block."""
    rows_per_block = q.block[0]
    return expand_blocks(q.scale_inv.float(), rows_per_block, 1, q.data.shape[0], q.scale_inv.shape[1]).contiguous()


def gemm_scaled_mm(a: QTensor, b: QTensor) -> torch.Tensor:
    if a.block is None and b.block is None:
        return torch._scaled_mm(a.data, b.data.t(), scale_a=a.scale_inv.float().reshape(()),
                                scale_b=b.scale_inv.float().reshape(()), out_dtype=torch.float32)
    assert a.block is not None and b.block is not None and a.block[1] == b.block[1], (a.block, b.block)
    block_k = a.block[1]
    scale_a, scale_b = _row_scales(a), _row_scales(b)
    out = torch.zeros(a.data.shape[0], b.data.shape[0], dtype=torch.float32, device=a.data.device)
    for j in range(scale_a.shape[1]):
        cols = slice(j * block_k, (j + 1) * block_k)
        out += torch._scaled_mm(a.data[:, cols].contiguous(), b.data[:, cols].contiguous().t(),
                                scale_a=scale_a[:, j:j + 1].contiguous(),
                                scale_b=scale_b[:, j].reshape(1, -1).contiguous(),
                                out_dtype=torch.float32)
    return out


GEMMS = {"scaled_mm": gemm_scaled_mm, "emulated": gemm_emulated}


@functools.cache
def _scaled_mm_runs(device_type: str) -> bool:
    """Whether ``torch._scaled_mm`` accepts tensor-wise and row-wise scaled E4M3 x E5M2 here (a 16x16 probe)."""
    if not hasattr(torch, "_scaled_mm"):
        return False
    try:
        a = torch.ones(16, 16, device=device_type).to(torch.float8_e4m3fn)
        b = torch.ones(16, 16, device=device_type).to(torch.float8_e5m2)
        one = torch.ones((), device=device_type)
        torch._scaled_mm(a, b.t(), scale_a=one, scale_b=one, out_dtype=torch.float32)
        torch._scaled_mm(a, b.t(), scale_a=torch.ones(16, 1, device=device_type),
                         scale_b=torch.ones(1, 16, device=device_type), out_dtype=torch.float32)
    except (RuntimeError, NotImplementedError, TypeError):
        return False
    return True


def executor_missing(name: str, device_type: str) -> str | None:
    """Why executor ``name`` cannot run on ``device_type``, or None when it can."""
    if name == "transformer_engine":
        return None if importlib.util.find_spec("transformer_engine") else "transformer_engine is not importable"
    if name == "scaled_mm":
        return None if _scaled_mm_runs(device_type) else f"torch._scaled_mm does not run on {device_type}"
    if name == "emulated":
        return None
    return f"unknown FP8 executor '{name}' (known: {', '.join(EXECUTORS)})"


def select_executor(backend, requested: str = "auto") -> str:
    """``requested`` if this backend offers it and it runs, else (``auto``) the first one that runs."""
    if requested != "auto":
        if requested not in backend.fp8_executors:
            raise ValueError(f"--fp8-executor {requested} is not offered by backend {backend.name} "
                             f"(offers: {', '.join(backend.fp8_executors)})")
        reason = executor_missing(requested, backend.device_type)
        if reason:
            raise ValueError(f"--fp8-executor {requested}: {reason}")
        return requested
    for name in backend.fp8_executors:
        if executor_missing(name, backend.device_type) is None:
            return name
    raise ValueError(f"no FP8 executor runs on backend {backend.name}")
