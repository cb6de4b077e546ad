"""The data and loss side of context parallelism: per-CP-rank batch slices and the CP-combined LM loss.

``batch_on_this_cp_rank(batch)``: megatron-core's ``get_batch_on_this_cp_rank`` (sequence cut into 2*CP chunks,
rank r keeps chunks r and 2*CP-1-r) on the training batch dict; a no-op without CP. Position ids travel with
the tokens, so learned positions and RoPE (megatron's RotaryEmbedding slices its table the same way) follow
the chunks.
``cp_loss(losses, mask)``: the micro-batch's masked mean token loss when its tokens are spread over the CP
group. Returns ``(loss, report)``: ``loss`` is this rank's token-loss sum over the micro-batch's total token
count (megatron-core's schedule multiplies a 2-tuple loss by the CP size, and DDP averages gradients over
DP x CP, so the gradient is that of the full-sequence mean); ``report`` is the full mean, equal on every CP rank.
May assume: megatron-core parallel state initialised.
"""

from __future__ import annotations

import torch
from megatron.core import parallel_state
from megatron.core.utils import get_batch_on_this_cp_rank


def batch_on_this_cp_rank(batch: dict) -> dict:
    if parallel_state.get_context_parallel_world_size() == 1:
        return batch
    return get_batch_on_this_cp_rank(dict(batch))


def cp_loss(losses: torch.Tensor, mask: torch.Tensor):
    local_sum = torch.sum(losses * mask)
    totals = torch.stack([local_sum.detach(), mask.sum()]).double()
    torch.distributed.all_reduce(totals, group=parallel_state.get_context_parallel_group())
    loss = local_sum / totals[1].to(local_sum.dtype)
    return loss, {"lm loss": (totals[0] / totals[1]).to(local_sum.dtype)}
