"""Attention on one (query block, key/value block) pair with its log-sum-exp, and the LSE merge.

Context-parallel attention computes a rank's output from several key/value blocks and combines the partial
results by their log-sum-exp (online softmax). This module is that per-block kernel and its backward:
- ``block_forward(q, k, v, causal, scale) -> (out, lse)``
- ``block_backward(dout, q, k, v, out, lse, causal, scale) -> (dq, dk, dv)`` where ``out``/``lse`` are the
  *final* (merged) output and log-sum-exp of the query rows, as in flash-attention's backward.
- ``merge(out_acc, lse_acc, out, lse)`` folds one block's result into an fp32 accumulator.

Layout ``[b, heads, s, d]``; GQA: ``k``/``v`` have ``hq / g`` heads, query head ``j`` uses kv head ``j // g``
(megatron's repeat_interleave order) and repeated KV heads are never materialised. ``causal`` is the square
top-left causal mask (a diagonal block of the load-balanced layout). q/k head dim may differ from v's (MLA).
Two implementations with one contract: on CPU tensors torch's flash kernel
(``aten::_scaled_dot_product_flash_attention_for_cpu`` and its backward, which return/take the LSE), otherwise
an explicit fp32 computation of the block (the block is ``s/(2*CP)`` square, so its scores are small).
May assume: torch >= 2.5; no process groups, no device API calls.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# Tests flip this to check the two implementations against each other on CPU.
USE_CPU_FLASH = True


def _use_flash(q: torch.Tensor) -> bool:
    return USE_CPU_FLASH and q.device.type == "cpu" and q.dtype in (torch.float32, torch.float64, torch.bfloat16,
                                                                      torch.float16)


def _pad_last(t: torch.Tensor, size: int) -> torch.Tensor:
    return t if t.shape[-1] == size else F.pad(t, (0, size - t.shape[-1]))


def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _causal_mask(sq: int, sk: int, device) -> torch.Tensor:
    """True where the key is in the future of the query (top-left aligned)."""
    return torch.ones(sq, sk, dtype=torch.bool, device=device).triu(1)


def _fold_groups(q: torch.Tensor, num_kv_heads: int) -> torch.Tensor:
    """[b, hq, s, d] -> [b, hk, g*s, d]: each kv head's query heads stacked along the rows."""
    b, hq, s, d = q.shape
    return q.reshape(b, num_kv_heads, (hq // num_kv_heads) * s, d)


def _math_forward(q, k, v, causal, scale):
    b, hq, sq, _ = q.shape
    hk, sk = k.shape[1], k.shape[2]
    acc = _acc_dtype(q.dtype)
    scores = torch.matmul(_fold_groups(q, hk).to(acc), k.to(acc).transpose(-1, -2)) * scale
    if causal:
        scores = scores.view(b, hk, hq // hk, sq, sk).masked_fill(_causal_mask(sq, sk, q.device), float("-inf"))
        scores = scores.view(b, hk, -1, sk)
    lse = torch.logsumexp(scores, dim=-1)
    out = torch.matmul(torch.exp(scores - lse.unsqueeze(-1)), v.to(acc))
    return out.view(b, hq, sq, -1).to(q.dtype), lse.view(b, hq, sq)


def _math_backward(dout, q, k, v, out, lse, causal, scale):
    b, hq, sq, _ = q.shape
    hk, sk = k.shape[1], k.shape[2]
    acc = _acc_dtype(q.dtype)
    qf, kf, vf = _fold_groups(q, hk).to(acc), k.to(acc), v.to(acc)
    dof, of = _fold_groups(dout, hk).to(acc), _fold_groups(out, hk).to(acc)
    scores = torch.matmul(qf, kf.transpose(-1, -2)) * scale
    probs = torch.exp(scores - lse.reshape(b, hk, -1, 1).to(acc))
    if causal:
        probs = probs.view(b, hk, hq // hk, sq, sk).masked_fill(_causal_mask(sq, sk, q.device), 0.0)
        probs = probs.view(b, hk, -1, sk)
    dv = torch.matmul(probs.transpose(-1, -2), dof)
    dprobs = torch.matmul(dof, vf.transpose(-1, -2))
    delta = (dof * of).sum(-1, keepdim=True)
    dscores = probs * (dprobs - delta) * scale
    dq = torch.matmul(dscores, kf).view(q.shape)
    dk = torch.matmul(dscores.transpose(-1, -2), qf)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


def _flash_forward(q, k, v, causal, scale):
    d = max(q.shape[-1], v.shape[-1])
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        _pad_last(q, d), _pad_last(k, d), _pad_last(v, d), 0.0, causal, scale=scale)
    return out[..., : v.shape[-1]], lse


def _flash_backward(dout, q, k, v, out, lse, causal, scale):
    d = max(q.shape[-1], v.shape[-1])
    dq, dk, dv = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
        _pad_last(dout.contiguous(), d), _pad_last(q, d), _pad_last(k, d), _pad_last(v, d),
        _pad_last(out.contiguous(), d), lse, 0.0, causal, scale=scale)
    return dq[..., : q.shape[-1]], dk[..., : k.shape[-1]], dv[..., : v.shape[-1]]


def block_forward(q, k, v, causal: bool, scale: float):
    """(out [b, hq, sq, dv] in q's dtype, lse [b, hq, sq] in fp32 (fp64 for fp64 inputs))."""
    if _use_flash(q):
        return _flash_forward(q, k, v, causal, scale)
    return _math_forward(q, k, v, causal, scale)


def block_backward(dout, q, k, v, out, lse, causal: bool, scale: float):
    """Gradients of this block's contribution given the final output and LSE of the query rows."""
    if _use_flash(q):
        return _flash_backward(dout, q, k, v, out, lse, causal, scale)
    return _math_backward(dout, q, k, v, out, lse, causal, scale)


def merge(out_acc: torch.Tensor, lse_acc: torch.Tensor, out: torch.Tensor, lse: torch.Tensor) -> None:
    """In place: (out_acc, lse_acc) <- softmax-weighted combination with a new block's (out, lse)."""
    new_lse = torch.logaddexp(lse_acc, lse)
    # rows no block has reached yet have lse_acc = -inf: exp(-inf - x) = 0, so they take the new block as is
    out_acc.mul_(torch.exp(lse_acc - new_lse).unsqueeze(-1)).add_(
        out.to(out_acc.dtype) * torch.exp(lse - new_lse).unsqueeze(-1))
    lse_acc.copy_(new_lse)
