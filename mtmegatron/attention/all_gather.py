"""All-gather context parallelism (``--cp-comm-type all_gather``): gather K/V over the CP group, then attend.

K and V are gathered with megatron-core's autograd-aware sequence gather (backward: reduce-scatter of the
gradients), put back in natural chunk order, and each of this rank's two load-balanced query chunks attends
to the key prefix that causality allows, through ``scaled_dot_product_attention`` with a bottom-right causal
mask (with a sliding window, a band; a sink, window_sink.py's extra key). Simpler than the ring (autograd does the backward), at the price of holding the whole K/V per rank.
May assume: torch.distributed is initialised; tensors ``[b, heads, s_local, d]``, ``s_local`` even.
"""

from __future__ import annotations

import torch
from megatron.core.tensor_parallel.mappings import gather_from_sequence_parallel_region

from mtmegatron.attention.sdpa import sdpa
from mtmegatron.attention.window_sink import block_allowed, sdpa_window_sink


def _natural_order(size: int) -> list[int]:
    """Position, in the gathered [rank 0 chunks, rank 1 chunks, ...] layout, of each global chunk 0..2N-1."""
    where = {}
    for rank in range(size):
        where[rank] = 2 * rank
        where[2 * size - 1 - rank] = 2 * rank + 1
    return [where[chunk] for chunk in range(2 * size)]


def _gather_kv(t: torch.Tensor, group) -> torch.Tensor:
    """[b, h, s_local, d] on each rank -> [b, h, s_global, d] in natural sequence order."""
    size = group.size()
    gathered = gather_from_sequence_parallel_region(t.permute(2, 0, 1, 3).contiguous(), True, group)
    chunks = gathered.view(2 * size, gathered.shape[0] // (2 * size), *gathered.shape[1:])
    order = torch.tensor(_natural_order(size), device=t.device)
    ordered = chunks.index_select(0, order).flatten(0, 1)
    return ordered.permute(1, 2, 0, 3)


def all_gather_attention(q, k, v, causal: bool, scale: float, group, window=None, sink=None) -> torch.Tensor:
    """Attention of this rank's load-balanced query chunks over the whole sequence; ``[b, hq, s_local, dv]``.
    ``window``/``sink``: window_sink.py's, on global positions (the query chunks sit at their chunk offsets)."""
    rank, size = group.rank(), group.size()
    k_all, v_all = _gather_kv(k, group), _gather_kv(v, group)
    if not causal and window is None and sink is None:
        return sdpa(q, k_all, v_all, scale=scale)
    chunk = q.shape[2] // 2
    outs = []
    for q_half, chunk_id in zip(q.chunk(2, dim=2), (rank, 2 * size - 1 - rank)):
        end = (chunk_id + 1) * chunk if causal else k_all.shape[2]
        # query row i sits at global position chunk_id*chunk + i and sees keys up to and including it
        allowed = block_allowed(chunk_id * chunk, chunk, 0, end, window, causal, q.device)
        outs.append(sdpa_window_sink(q_half, k_all[:, :, :end], v_all[:, :, :end], allowed, sink, scale))
    return torch.cat(outs, dim=2)
