"""The data and loss side of context parallelism: per-CP-rank batch slices and the CP-combined LM loss.

``batch_on_this_cp_rank(batch)``: megatron-core's ``get_batch_on_this_cp_rank`` (sequence cut into 2*CP chunks,
rank r keeps chunks r and 2*CP-1-r) on the training batch dict; a no-op without CP. Position ids travel with
the tokens, so learned positions and RoPE (megatron's RotaryEmbedding slices its table the same way) follow
the chunks. A packed THD batch (it carries ``cu_seqlens_padded``) is cut the way megatron-core's
``get_thd_batch_on_this_cp_rank`` cuts it (TransformerEngine's ``thd_get_partitioned_indices``): EVERY
sequence into 2*CP chunks, rank r keeping chunks r and 2*CP-1-r of each, in sequence order
(``thd_partition_index``); ``cu_seqlens*`` and ``max_seqlen`` stay global, as megatron-core's THD RoPE and our
THD CP attention (thd_cp.py) expect.
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


THD_GLOBAL_KEYS = ("cu_seqlens", "cu_seqlens_padded", "max_seqlen")


def thd_partition_index(cu_seqlens_padded: torch.Tensor, cp_size: int, cp_rank: int) -> torch.Tensor:
    """Positions (into the packed row) that CP rank ``cp_rank`` holds: of each sequence ``[s, e)`` (a multiple
    of 2*CP long, chunk ``c = (e - s) / (2*CP)``), chunks ``cp_rank`` and ``2*CP-1-cp_rank``."""
    bounds = cu_seqlens_padded.tolist()
    pieces = []
    for start, end in zip(bounds[:-1], bounds[1:]):
        chunk = (end - start) // (2 * cp_size)
        for c in (cp_rank, 2 * cp_size - 1 - cp_rank):
            pieces.append(torch.arange(start + c * chunk, start + (c + 1) * chunk))
    return torch.cat(pieces).to(cu_seqlens_padded.device)


def batch_on_this_cp_rank(batch: dict) -> dict:
    cp_size = parallel_state.get_context_parallel_world_size()
    if cp_size == 1:
        return batch
    if "cu_seqlens_padded" in batch:
        index = thd_partition_index(batch["cu_seqlens_padded"], cp_size, parallel_state.get_context_parallel_rank())
        index = index.to(batch["tokens"].device)
        return {key: value if key in THD_GLOBAL_KEYS else value.index_select(1, index)
                for key, value in batch.items()}
    return get_batch_on_this_cp_rank(dict(batch))


def cp_loss(losses: torch.Tensor, mask: torch.Tensor):
    local_sum = torch.sum(losses * mask)
    totals = torch.stack([local_sum.detach(), mask.sum()]).double()
    torch.distributed.all_reduce(totals, group=parallel_state.get_context_parallel_group())
    loss = local_sum / totals[1].to(local_sum.dtype)
    return loss, {"lm loss": (totals[0] / totals[1]).to(local_sum.dtype)}
