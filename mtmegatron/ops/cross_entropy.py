"""Cross-entropy fused with log-softmax over the vocab.

Ops:
- `cross_entropy_stats(logits [..., v], target [...], vocab_start) -> (max, sumexp, target_logit)`: the per-row
  partial statistics of one vocab shard (target ids are global; target_logit is 0 off-shard). One pass over the
  logits; no autograd (it is the building block of the tensor-parallel loss in vocab_parallel.py).
- `cross_entropy(logits, target, ignore_index) -> (loss, lse)`: full-vocab loss per row (0 where ignored), fp32
  (fp64 for double logits), with autograd through
- `cross_entropy_backward(grad_loss, logits, target, lse, vocab_start, ignore_index) -> grad_logits`:
  (softmax - onehot) * grad_loss, written in the logits dtype; works on a shard given the global lse.
May assume: torch >= 2.7; device agnostic.
"""
from __future__ import annotations

import torch

from ._library import define


def _acc(t):
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def _local_target(target, vocab_start, vocab):
    local = target.long() - vocab_start
    inside = (local >= 0) & (local < vocab)
    return local.clamp(0, max(vocab - 1, 0)), inside


def cross_entropy_stats_reference(logits, target, vocab_start):
    x = logits.to(_acc(logits))
    mx = x.amax(-1)
    sumexp = torch.exp(x - mx.unsqueeze(-1)).sum(-1)
    local, inside = _local_target(target, vocab_start, x.shape[-1])
    tl = x.gather(-1, local.unsqueeze(-1)).squeeze(-1)
    return mx, sumexp, torch.where(inside, tl, torch.zeros_like(tl))


def cross_entropy_reference(logits, target, ignore_index):
    mx, sumexp, tl = cross_entropy_stats_reference(logits, target, 0)
    lse = mx + sumexp.log()
    loss = torch.where(target == ignore_index, torch.zeros_like(lse), lse - tl)
    return loss, lse


def cross_entropy_backward_reference(grad_loss, logits, target, lse, vocab_start, ignore_index):
    acc = _acc(logits)
    g = torch.where(target == ignore_index, torch.zeros_like(grad_loss), grad_loss).to(acc)
    p = torch.exp(logits.to(acc) - lse.to(acc).unsqueeze(-1))
    local, inside = _local_target(target, vocab_start, logits.shape[-1])
    onehot = torch.zeros_like(p).scatter(-1, local.unsqueeze(-1), inside.unsqueeze(-1).to(acc))
    return ((p - onehot) * g.unsqueeze(-1)).to(logits.dtype)


cross_entropy_stats_op = define(
    "cross_entropy_stats(Tensor logits, Tensor target, int vocab_start) -> (Tensor, Tensor, Tensor)",
    cross_entropy_stats_reference,
)
cross_entropy_op = define(
    "cross_entropy(Tensor logits, Tensor target, int ignore_index) -> (Tensor, Tensor)", cross_entropy_reference
)
cross_entropy_backward_op = define(
    "cross_entropy_backward(Tensor grad_loss, Tensor logits, Tensor target, Tensor lse, int vocab_start,"
    " int ignore_index) -> Tensor",
    cross_entropy_backward_reference,
)


def _row_stat(logits):
    return logits.new_empty(logits.shape[:-1], dtype=_acc(logits))


@torch.library.register_fake("mtmegatron::cross_entropy_stats")
def _(logits, target, vocab_start):
    return _row_stat(logits), _row_stat(logits), _row_stat(logits)


@torch.library.register_fake("mtmegatron::cross_entropy")
def _(logits, target, ignore_index):
    return _row_stat(logits), _row_stat(logits)


@torch.library.register_fake("mtmegatron::cross_entropy_backward")
def _(grad_loss, logits, target, lse, vocab_start, ignore_index):
    return torch.empty_like(logits)


def _setup(ctx, inputs, output):
    logits, target, ignore_index = inputs
    ctx.save_for_backward(logits, target, output[1])
    ctx.ignore_index = ignore_index


def _backward(ctx, grad_loss, grad_lse):
    logits, target, lse = ctx.saved_tensors
    return cross_entropy_backward_op(grad_loss, logits, target, lse, 0, ctx.ignore_index), None, None


torch.library.register_autograd("mtmegatron::cross_entropy", _backward, setup_context=_setup)


def cross_entropy(logits: torch.Tensor, target: torch.Tensor, ignore_index: int = -100) -> torch.Tensor:
    """Per-token loss (no reduction), fp32; logits [..., vocab], target [...]."""
    return cross_entropy_op(logits, target, ignore_index)[0]
