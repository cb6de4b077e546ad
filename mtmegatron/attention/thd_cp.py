"""Packed (THD) attention under context parallelism: all-gathered K/V, attention per sequence.

Layout (megatron-core's THD CP convention, attention/cp_batch.py): the packed row holds sequences at
``cu_seqlens_padded`` (each a multiple of 2*CP long); CP rank r holds chunks r and 2*CP-1-r of EVERY
sequence, sequence after sequence. Here K and V are gathered over the CP group with megatron-core's
autograd-aware sequence gather (backward: reduce-scatter), put back in packed-row order with the inverse of
the partition index, and each of this rank's query chunks attends, inside its own sequence only, to the key
prefix causality allows (a bottom-right causal mask; sliding windows and sinks through window_sink.py on positions inside the sequence), through
``scaled_dot_product_attention``. So no token
sees another sequence, and autograd does the backward.
Cost: every rank holds the whole packed K/V of the micro-batch (as ``--cp-comm-type all_gather`` does) and
attention is a Python loop of two SDPA calls per sequence per layer; ``--cp-comm-type p2p`` (the ring) takes
this path too for THD. Pad positions inside a sequence (up to the 2*CP multiple) come after its real tokens,
so causal attention keeps the real tokens from seeing them (their own outputs carry no loss).
May assume: torch.distributed is initialised; ``[t_local, heads, d]`` tensors with ``t_local`` the sum of
the per-rank shares (``padded length / CP``) of the sequences at ``cu_seqlens_padded``.
"""

from __future__ import annotations

import torch
from megatron.core.tensor_parallel.mappings import gather_from_sequence_parallel_region

from mtmegatron.attention.cp_batch import thd_partition_index
from mtmegatron.attention.sdpa import sdpa
from mtmegatron.attention.window_sink import block_allowed, sdpa_window_sink


def _gather_in_row_order(t: torch.Tensor, cu_seqlens_padded: torch.Tensor, group) -> torch.Tensor:
    """[t_local, h, d] on each CP rank -> [t_global, h, d] in packed-row order."""
    size = group.size()
    gathered = gather_from_sequence_parallel_region(t.contiguous(), True, group)  # rank 0's share, rank 1's...
    held = torch.cat([thd_partition_index(cu_seqlens_padded, size, r) for r in range(size)])
    return gathered.index_select(0, torch.argsort(held).to(t.device))


def _heads_first(t: torch.Tensor) -> torch.Tensor:
    """[s, h, d] -> [1, h, s, d]."""
    return t.transpose(0, 1).unsqueeze(0)


def thd_cp_attention(query, key, value, cu_seqlens_padded: torch.Tensor, causal: bool, scale: float,
                     group, window=None, sink=None) -> torch.Tensor:
    """This rank's share of packed sequences attending within their sequences; ``[t_local, hq, dv]``.
    ``window``/``sink``: window_sink.py's, on positions inside each sequence."""
    rank, size = group.rank(), group.size()
    bounds = cu_seqlens_padded.tolist()
    key_all = _gather_in_row_order(key, cu_seqlens_padded, group)
    value_all = _gather_in_row_order(value, cu_seqlens_padded, group)
    outs, local = [], 0
    for start, end in zip(bounds[:-1], bounds[1:]):
        chunk = (end - start) // (2 * size)
        for chunk_id in (rank, 2 * size - 1 - rank):
            q = _heads_first(query[local: local + chunk])
            local += chunk
            stop = start + (chunk_id + 1) * chunk if causal else end
            k, v = _heads_first(key_all[start:stop]), _heads_first(value_all[start:stop])
            if window is None and sink is None:
                # query row i sits at chunk_id*chunk + i in its sequence and sees keys up to and including it
                mask = (torch.ones(chunk, stop - start, dtype=torch.bool, device=query.device)
                        .tril(diagonal=chunk_id * chunk) if causal else None)
                out = sdpa(q, k, v, attn_mask=mask, scale=scale)
            else:
                allowed = block_allowed(chunk_id * chunk, chunk, 0, stop - start, window, causal, query.device)
                out = sdpa_window_sink(q, k, v, allowed, sink, scale)
            outs.append(out[0].transpose(0, 1))
    return torch.cat(outs, dim=0)
