"""Tensor-parallel (vocab-sharded) cross-entropy built on the `cross_entropy_stats` / `cross_entropy_backward`
ops, with megatron's `vocab_parallel_cross_entropy(vocab_parallel_logits, target)` contract: logits
[s, b, v/tp] (this rank's contiguous vocab shard), target [s, b] global ids, returns the per-token loss [s, b].

Combination across ranks (each rank reads its logits once): local (m_r, S_r, t_r) -> M = allreduce_max(m_r);
S = allreduce_sum(S_r * exp(m_r - M)); t = allreduce_sum(t_r); loss = M + log S - t. Backward is local:
grad = (exp(logit - lse) - onehot) * grad_loss. Three all-reduces of [tokens] vectors, like megatron.
May assume: torch.distributed is initialised when tp_group has more than one rank; device agnostic.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist

from .cross_entropy import cross_entropy_backward_op, cross_entropy_stats_op


class _VocabParallelCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, target, group, ignore_index):
        world = dist.get_world_size(group) if group is not None else 1
        rank = dist.get_rank(group) if group is not None else 0
        vocab_start = rank * logits.shape[-1]
        mx, sumexp, tl = cross_entropy_stats_op(logits, target, vocab_start)
        if world > 1:
            global_max = mx.clone()
            dist.all_reduce(global_max, op=dist.ReduceOp.MAX, group=group)
            sumexp = sumexp * torch.exp(mx - global_max)
            dist.all_reduce(sumexp, group=group)
            dist.all_reduce(tl, group=group)
            mx = global_max
        lse = mx + sumexp.log()
        loss = torch.where(target == ignore_index, torch.zeros_like(lse), lse - tl)
        ctx.save_for_backward(logits, target, lse)
        ctx.vocab_start, ctx.ignore_index = vocab_start, ignore_index
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        logits, target, lse = ctx.saved_tensors
        grad = cross_entropy_backward_op(grad_loss.contiguous(), logits, target, lse, ctx.vocab_start, ctx.ignore_index)
        return grad, None, None, None


def vocab_parallel_cross_entropy(
    vocab_parallel_logits: torch.Tensor,
    target: torch.Tensor,
    label_smoothing: float = 0.0,
    tp_group: Optional[dist.ProcessGroup] = None,
    ignore_index: int = -100,
) -> torch.Tensor:
    """Fused replacement for megatron.core.tensor_parallel.vocab_parallel_cross_entropy (no label smoothing).

    tp_group None means megatron's tensor-model-parallel group when model parallel is initialised, else a
    single rank."""
    if label_smoothing != 0.0:
        raise ValueError("mtmegatron fused cross-entropy does not implement label smoothing; use megatron's")
    if tp_group is None:
        from megatron.core import parallel_state

        if parallel_state.model_parallel_is_initialized():
            tp_group = parallel_state.get_tensor_model_parallel_group()
    return _VocabParallelCrossEntropy.apply(vocab_parallel_logits, target, tp_group, ignore_index)
