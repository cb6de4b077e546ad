"""The grouped matmul of MoE experts, with the signature megatron-core's legacy ``GroupedMLP`` calls
(``grouped_gemm.ops.gmm``): ``gmm(a [T, K], b [E, K, N], batch_sizes [E], trans_b=False) -> [T, N]``, rows of ``a``
taken by group in order (group ``e`` owns ``batch_sizes[e]`` consecutive rows and multiplies them by ``b[e]``;
``trans_b`` multiplies by ``b[e].T`` with ``b`` of shape [E, N, K]). Differentiable in ``a`` and ``b``.

Two paths, chosen per call by ``grouped_mm_path``:
- ``torch._grouped_mm`` (one call for all groups) where the installed torch has it for the tensors' device and
  dtype: probed once per (device type, dtype) with a tiny call, and used only when every row stride is a multiple
  of 16 bytes (its rule on every device). torch 2.13 has it on CPU (fp32/bf16/fp16) and CUDA; torch_musa builds
  may not, and torch before 2.8 does not.
- a loop of one ``matmul`` per group (any device, any dtype): the fallback.
``patches/grouped_gemm_ops.py`` installs this module's ``ops`` as megatron-core's ``gg.ops``.
May assume: ``batch_sizes`` sums to ``a``'s rows (megatron's dispatchers guarantee it); torch >= 2.7.
"""

from __future__ import annotations

import functools
import types

import torch

ALIGNMENT_BYTES = 16


class _ContiguousGrad(torch.autograd.Function):
    """Identity whose backward makes the incoming gradient dense: ``torch._grouped_mm``'s backward refuses the
    zero-stride gradients an ``expand`` (e.g. ``out.sum()``) produces."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad.contiguous()


@functools.cache
def _torch_grouped_mm_works(device_type: str, dtype: torch.dtype) -> bool:
    """Whether ``torch._grouped_mm`` runs forward and backward for ``dtype`` on ``device_type`` (tiny probe)."""
    if not hasattr(torch, "_grouped_mm"):
        return False
    device = torch.device(device_type)
    try:
        a = torch.ones(4, 8, device=device, dtype=dtype, requires_grad=True)
        b = torch.ones(2, 8, 8, device=device, dtype=dtype, requires_grad=True)
        offs = torch.tensor([1, 4], device=device, dtype=torch.int32)
        out = torch._grouped_mm(a, b, offs=offs)
        out.backward(torch.ones_like(out))
        return bool(torch.all(out == 8).item()) and bool(torch.all(b.grad[1] == 3).item())
    except (RuntimeError, NotImplementedError, TypeError):
        return False


def _aligned(t: torch.Tensor) -> bool:
    """Row-major or column-major in the last two dims, every other stride and the start on 16 bytes."""
    size = t.element_size()
    return ((t.stride(-1) == 1 or t.stride(-2) == 1) and t.data_ptr() % ALIGNMENT_BYTES == 0
            and all(s * size % ALIGNMENT_BYTES == 0 for s in t.stride() if s != 1))


def grouped_mm_path(a: torch.Tensor, b: torch.Tensor, trans_b: bool = False) -> str:
    """``"torch._grouped_mm"`` or ``"loop"``: what ``gmm`` runs for these operands."""
    rhs = b.transpose(-1, -2) if trans_b else b
    if a.dtype != b.dtype or not _torch_grouped_mm_works(a.device.type, a.dtype):
        return "loop"
    return "torch._grouped_mm" if _aligned(a) and _aligned(rhs) else "loop"


def _loop(a: torch.Tensor, b: torch.Tensor, sizes: list[int]) -> torch.Tensor:
    pieces = [rows @ weight for rows, weight in zip(torch.split(a, sizes), b.unbind(0))]
    return torch.cat(pieces)


def gmm(a: torch.Tensor, b: torch.Tensor, batch_sizes: torch.Tensor, trans_b: bool = False) -> torch.Tensor:
    """``cat([a_e @ b[e] for each group e])`` (``b[e].T`` with ``trans_b``); see the module docstring."""
    if trans_b:
        b = b.transpose(-1, -2)
    if grouped_mm_path(a, b) == "loop":
        return _loop(a, b, [int(n) for n in batch_sizes.tolist()])
    offs = torch.cumsum(batch_sizes.to(device=a.device), 0).to(torch.int32)
    out = torch._grouped_mm(a, b, offs=offs)
    return _ContiguousGrad.apply(out) if out.requires_grad else out


# the shape of the grouped_gemm package that megatron-core imports as ``grouped_gemm`` (``.ops.gmm``)
ops = types.SimpleNamespace(gmm=gmm)
package = types.SimpleNamespace(ops=ops, __name__="mtmegatron.ops.grouped_mm")
