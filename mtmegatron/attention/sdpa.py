"""``scaled_dot_product_attention`` with the GQA and MLA shapes megatron produces, in ``[b, heads, s, d]``.

GQA goes to the kernel as ``enable_gqa=True`` (torch >= 2.5, present in the torch 2.7 MUSA floor), so the
repeated KV heads are never materialised; MLA's q/k head dim != v head dim is passed through as is (the
kernels that cannot take it are skipped by torch's dispatcher, the math kernel can). Boolean masks follow
torch: True = may attend.
May assume: torch >= 2.5; no process groups, no device API calls.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None = None,
         is_causal: bool = False, scale: float | None = None, dropout_p: float = 0.0) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                                          scale=scale, enable_gqa=k.shape[1] != q.shape[1])
