"""``scaled_dot_product_attention`` with the GQA and MLA shapes megatron produces, in ``[b, heads, s, d]``.

GQA (fewer KV heads than query heads) reaches the kernel one of two ways, chosen by ``gqa_mode``:
- ``enable_gqa=True`` (torch >= 2.5, present in the torch 2.7 MUSA floor): the repeated KV heads are never
  materialised. On CPU torch's flash kernel takes it; on CUDA only the flash kernel does, and flash takes only
  fp16/bf16 without a mask, so
- K/V are repeated per query head (``repeat_interleave``, megatron's order) where the backend names CUDA's
  memory-efficient kernel (fp32 or masked batches), which then runs instead of the O(s^2)-memory math kernel
  ``enable_gqa`` would fall to. MUSA keeps ``enable_gqa`` (which torch_musa kernels accept it is not verified).
MLA's q/k head dim != v head dim is passed through as is (the kernels that cannot take it are skipped by torch's
dispatcher, the math kernel can). Boolean masks follow torch: True = may attend.
May assume: torch >= 2.5; no process groups, no device API calls.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from mtmegatron.backends.registry import backend_for


def gqa_mode(device_type: str, dtype: torch.dtype, masked: bool, num_heads: int, num_kv_heads: int,
             head_dim: int) -> str:
    """``"none"`` (as many KV heads as query heads), ``"enable_gqa"`` or ``"repeat_kv"``."""
    if num_heads == num_kv_heads:
        return "none"
    kernel = backend_for(device_type).attention_kernel(dtype, head_dim, masked)
    return "repeat_kv" if kernel == "cuda_efficient" else "enable_gqa"


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None = None,
         is_causal: bool = False, scale: float | None = None, dropout_p: float = 0.0) -> torch.Tensor:
    mode = gqa_mode(q.device.type, q.dtype, attn_mask is not None, q.shape[1], k.shape[1], q.shape[-1])
    if mode == "repeat_kv":
        groups = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                                          scale=scale, enable_gqa=mode == "enable_gqa")
