"""Attention on one (query block, key/value block) pair with its log-sum-exp, and the LSE merge.

Context-parallel attention computes a rank's output from several key/value blocks and combines the partial
results by their log-sum-exp (online softmax). This module is that per-block kernel and its backward:
- ``block_forward(q, k, v, causal, scale) -> (out, lse)``
- ``block_backward(dout, q, k, v, out, lse, causal, scale) -> (dq, dk, dv)`` where ``out``/``lse`` are the
  *final* (merged) output and log-sum-exp of the query rows, as in flash-attention's backward.
- ``merge(out_acc, lse_acc, out, lse)`` folds one block's result into an fp32 accumulator.

Layout ``[b, heads, s, d]``; GQA: ``k``/``v`` have ``hq / g`` heads, query head ``j`` uses kv head ``j // g``
(megatron's repeat_interleave order) and repeated KV heads are never materialised. ``causal`` is the square
top-left causal mask (a diagonal block of the load-balanced layout); ``allowed`` an explicit mask (a block a sliding
window cuts), always on the math kernel. q/k head dim may differ from v's (MLA).
One contract, one kernel per (device, dtype, head dim), named by the backend (``Backend.attention_kernel``; only
``block_kernel`` asks): ``cpu_flash``, ``cuda_flash`` (GQA native), ``cuda_efficient`` and ``musa_flash`` (where
torch_musa registers its op; both take no GQA: K/V repeated, their gradients summed back per group) wrap torch's
flash / memory-efficient aten ops and backwards, which return the LSE; ``math`` (fp64, other devices) is an explicit
fp32 computation of the block (the block is ``s/(2*CP)`` square, so its scores are small).
The fused kernels take one head dim for q/k and v: q/k/v are zero-padded to the larger one (rounded up to 8), which
changes no score, and the outputs are cropped. The CUDA and MUSA kernels were written against torch 2.9-2.13's
schemas and torch_musa's published op, and are not run here (no GPU in CI): ``tests/attention/test_block_kernels.py``
checks the choice with the device faked and the wrappers' reshaping/LSE handling with CPU stand-ins of the ops;
``tests/attention/test_context_parallel.py`` runs them against float64 attention on the GPU lane.
May assume: torch >= 2.5; no process groups, no device API calls.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from mtmegatron.backends.registry import backend_for

# Tests flip this to check the fused kernels against the math path.
USE_FUSED = True
_aten = torch.ops.aten  # tests swap in CPU stand-ins of the device ops


def _fused_head_dim(qk_dim: int, v_dim: int) -> int:
    return -(-max(qk_dim, v_dim) // 8) * 8


@functools.lru_cache(maxsize=None)
def _has_op(namespace, name: str) -> bool:
    return hasattr(namespace, name)


def block_kernel(device_type: str, dtype: torch.dtype, qk_dim: int, v_dim: int) -> str:
    """The kernel that computes a block on ``device_type`` (see the module docstring)."""
    kernel = backend_for(device_type).attention_kernel(dtype, _fused_head_dim(qk_dim, v_dim)) if USE_FUSED else "math"
    return "math" if kernel == "musa_flash" and not _has_op(_aten, "_scaled_dot_product_attention_flash_musa") else kernel


def _kernel(q: torch.Tensor, v: torch.Tensor) -> str:
    return block_kernel(q.device.type, q.dtype, q.shape[-1], v.shape[-1])


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


def _masked(causal, sq: int, sk: int, device, allowed=None):
    """True where a score is masked: the top-left causal mask, or ``~allowed`` when a mask is given."""
    if allowed is not None:
        return ~allowed
    return _causal_mask(sq, sk, device) if causal else None


def _math_forward(q, k, v, causal, scale, allowed=None):
    b, hq, sq, _ = q.shape
    hk, sk = k.shape[1], k.shape[2]
    acc = _acc_dtype(q.dtype)
    scores = torch.matmul(_fold_groups(q, hk).to(acc), k.to(acc).transpose(-1, -2)) * scale
    masked = _masked(causal, sq, sk, q.device, allowed)
    if masked is not None:
        scores = scores.view(b, hk, hq // hk, sq, sk).masked_fill(masked, float("-inf"))
        scores = scores.view(b, hk, -1, sk)
    lse = torch.logsumexp(scores, dim=-1)
    # a row that may attend no key of this block (a window's edge) has lse -inf: it contributes nothing
    finite = torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)
    out = torch.matmul(torch.exp(scores - finite.unsqueeze(-1)), v.to(acc))
    return out.view(b, hq, sq, -1).to(q.dtype), lse.view(b, hq, sq)


def _math_backward(dout, q, k, v, out, lse, causal, scale, allowed=None):
    b, hq, sq, _ = q.shape
    hk, sk = k.shape[1], k.shape[2]
    acc = _acc_dtype(q.dtype)
    qf, kf, vf = _fold_groups(q, hk).to(acc), k.to(acc), v.to(acc)
    dof, of = _fold_groups(dout, hk).to(acc), _fold_groups(out, hk).to(acc)
    scores = torch.matmul(qf, kf.transpose(-1, -2)) * scale
    probs = torch.exp(scores - lse.reshape(b, hk, -1, 1).to(acc))
    masked = _masked(causal, sq, sk, q.device, allowed)
    if masked is not None:
        probs = probs.view(b, hk, hq // hk, sq, sk).masked_fill(masked, 0.0)
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


def _repeat_kv(t: torch.Tensor, groups: int) -> torch.Tensor:
    return t if groups == 1 else t.repeat_interleave(groups, dim=1)


def _sum_groups(grad: torch.Tensor, groups: int) -> torch.Tensor:
    """[b, hk*g, s, d] gradient of repeated K/V -> [b, hk, s, d]."""
    if groups == 1:
        return grad
    b, h, s, d = grad.shape
    return grad.view(b, h // groups, groups, s, d).sum(2)


def _padded(q, k, v):
    d = _fused_head_dim(q.shape[-1], v.shape[-1])
    return _pad_last(q, d), _pad_last(k, d), _pad_last(v, d)


def _cuda_flash_forward(q, k, v, causal, scale):
    out, lse = _aten._scaled_dot_product_flash_attention(*_padded(q, k, v), 0.0, causal, False, scale=scale)[:2]
    return out[..., : v.shape[-1]], lse


def _cuda_flash_backward(dout, q, k, v, out, lse, causal, scale):
    d = _fused_head_dim(q.shape[-1], v.shape[-1])
    unused = torch.empty(0, dtype=torch.long, device=q.device)  # philox seed/offset: no dropout
    dq, dk, dv = _aten._scaled_dot_product_flash_attention_backward(
        _pad_last(dout.contiguous(), d), *_padded(q, k, v), _pad_last(out.contiguous(), d), lse.contiguous(),
        None, None, q.shape[2], k.shape[2], 0.0, causal, unused, unused, scale=scale)
    return dq[..., : q.shape[-1]], dk[..., : k.shape[-1]], dv[..., : v.shape[-1]]


def _cuda_efficient_forward(q, k, v, causal, scale):
    groups = q.shape[1] // k.shape[1]
    qp, kp, vp = _padded(q, _repeat_kv(k, groups), _repeat_kv(v, groups))
    out, lse = _aten._scaled_dot_product_efficient_attention(qp, kp, vp, None, True, 0.0, causal, scale=scale)[:2]
    return out[..., : v.shape[-1]], lse[..., : q.shape[2]]  # the kernel pads the LSE rows to a multiple of 32


def _cuda_efficient_backward(dout, q, k, v, out, lse, causal, scale):
    groups = q.shape[1] // k.shape[1]
    qp, kp, vp = _padded(q, _repeat_kv(k, groups), _repeat_kv(v, groups))
    d = qp.shape[-1]
    rows = -(-q.shape[2] // 32) * 32
    lse = F.pad(lse.contiguous(), (0, rows - lse.shape[-1]))
    unused = torch.empty(0, dtype=torch.long, device=q.device)
    dq, dk, dv = _aten._scaled_dot_product_efficient_attention_backward(
        _pad_last(dout.contiguous(), d), qp, kp, vp, None, _pad_last(out.contiguous(), d), lse, unused, unused,
        0.0, [True, True, True, False], causal, scale=scale)[:3]
    return (dq[..., : q.shape[-1]], _sum_groups(dk, groups)[..., : k.shape[-1]],
            _sum_groups(dv, groups)[..., : v.shape[-1]])


def _musa_flash_forward(q, k, v, causal, scale):
    groups = q.shape[1] // k.shape[1]
    qp, kp, vp = _padded(q, _repeat_kv(k, groups), _repeat_kv(v, groups))
    out, lse = _aten._scaled_dot_product_attention_flash_musa(qp, kp, vp, dropout_p=0.0, is_causal=causal,
                                                              scale=scale)[:2]
    return out[..., : v.shape[-1]], lse


def _musa_flash_backward(dout, q, k, v, out, lse, causal, scale):
    groups = q.shape[1] // k.shape[1]
    qp, kp, vp = _padded(q, _repeat_kv(k, groups), _repeat_kv(v, groups))
    d = qp.shape[-1]
    no_dropout = torch.empty(0, dtype=torch.bool, device=q.device)
    dq, dk, dv = _aten._scaled_dot_product_attention_flash_musa_backward(
        _pad_last(dout.contiguous(), d), qp, kp, vp, _pad_last(out.contiguous(), d), lse.contiguous(), no_dropout,
        causal, None, scale=scale)[:3]
    return (dq[..., : q.shape[-1]], _sum_groups(dk, groups)[..., : k.shape[-1]],
            _sum_groups(dv, groups)[..., : v.shape[-1]])


KERNELS = {  # name: (forward, backward)
    "cpu_flash": (_flash_forward, _flash_backward),
    "cuda_flash": (_cuda_flash_forward, _cuda_flash_backward),
    "cuda_efficient": (_cuda_efficient_forward, _cuda_efficient_backward),
    "musa_flash": (_musa_flash_forward, _musa_flash_backward),
    "math": (_math_forward, _math_backward),
}


def block_forward(q, k, v, causal: bool, scale: float, allowed=None):
    """(out [b, hq, sq, dv] in q's dtype, lse [b, hq, sq] in fp32 (fp64 for fp64 inputs)). ``allowed``: a
    ``[sq, sk]`` boolean mask (True = may attend; a sliding window's band) instead of ``causal``, computed
    by the math kernel (a row it leaves empty gets out 0, lse -inf)."""
    if allowed is not None:
        return _math_forward(q, k, v, False, scale, allowed)
    return KERNELS[_kernel(q, v)][0](q, k, v, causal, scale)


def block_backward(dout, q, k, v, out, lse, causal: bool, scale: float, allowed=None):
    """Gradients of this block's contribution given the final output and LSE of the query rows."""
    if allowed is not None:
        return _math_backward(dout, q, k, v, out, lse, False, scale, allowed)
    return KERNELS[_kernel(q, v)][1](dout, q, k, v, out, lse, causal, scale)


def merge(out_acc: torch.Tensor, lse_acc: torch.Tensor, out: torch.Tensor, lse: torch.Tensor) -> None:
    """In place: (out_acc, lse_acc) <- softmax-weighted combination with a new block's (out, lse)."""
    new_lse = torch.logaddexp(lse_acc, lse)
    # rows no block has reached yet have lse_acc = -inf: exp(-inf - x) = 0, so they take the new block as is; a row
    # that neither has reached (a window's edge) stays 0 with lse -inf (-inf - -inf would be NaN)
    reference = torch.where(torch.isinf(new_lse), torch.zeros_like(new_lse), new_lse)
    out_acc.mul_(torch.exp(lse_acc - reference).unsqueeze(-1)).add_(
        out.to(out_acc.dtype) * torch.exp(lse - reference).unsqueeze(-1))
    lse_acc.copy_(new_lse)
