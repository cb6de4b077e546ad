"""MoE token permutation by routing map, in megatron's order (rows grouped by expert, tokens ascending within an
expert), as ops:
- `moe_permute_index(routing_map [T, E] bool) -> (sorted_indices [N] int64, row_id_map [T, E] int32)`: the token
  of every permuted row, and the permuted row of every (token, expert) pair (-1 when not routed).
- `moe_permute(tokens [T, H], sorted_indices, row_id_map) -> [N, H]` (row gather; backward = unpermute).
- `moe_unpermute(permuted [N, H], row_id_map, probs [T, E] or None) -> [T, H]`: out[t] = sum_e probs[t,e] *
  permuted[row(t,e)], fp32 accumulation, per token (deterministic, no atomics).
- `moe_unpermute_backward(...) -> (grad_permuted, grad_probs)`.
`permute`/`unpermute` below keep the signatures of megatron.core.transformer.moe.moe_utils.permute/unpermute.
May assume: torch >= 2.7; device agnostic; megatron-core only for the drop-and-pad fallback.
"""
from __future__ import annotations

from typing import Optional

import torch

from ._library import define


def _acc(t):
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def moe_permute_index_reference(routing_map):
    m = routing_map.bool().T.contiguous()  # [E, T]
    num_experts, num_tokens = m.shape
    tokens = torch.arange(num_tokens, device=m.device).unsqueeze(0).expand(num_experts, -1)
    sorted_indices = tokens.masked_select(m)
    rows = torch.cumsum(m.reshape(-1).long(), 0).reshape(m.shape) - 1
    row_id_map = torch.where(m, rows, torch.full_like(rows, -1)).T.contiguous().to(torch.int32)
    return sorted_indices, row_id_map


def _routed_pairs(row_id_map):
    tok, exp = (row_id_map >= 0).nonzero(as_tuple=True)
    return tok, exp, row_id_map[tok, exp].long()


def moe_permute_reference(tokens, sorted_indices, row_id_map):
    return tokens.index_select(0, sorted_indices.long())


def moe_unpermute_reference(permuted, row_id_map, probs):
    tok, exp, rows = _routed_pairs(row_id_map)
    acc = _acc(permuted)
    src = permuted.index_select(0, rows).to(acc)
    if probs is not None:
        src = src * probs[tok, exp].to(acc).unsqueeze(-1)
    out = torch.zeros(row_id_map.shape[0], permuted.shape[1], dtype=acc, device=permuted.device)
    return out.index_add_(0, tok, src).to(permuted.dtype)


def moe_unpermute_backward_reference(grad_out, permuted, row_id_map, probs):
    tok, exp, rows = _routed_pairs(row_id_map)
    acc = _acc(permuted)
    g = grad_out.index_select(0, tok).to(acc)
    w = probs[tok, exp].to(acc).unsqueeze(-1) if probs is not None else 1.0
    grad_permuted = torch.zeros(permuted.shape, dtype=acc, device=permuted.device)
    grad_permuted[rows] = g * w
    if probs is None:
        grad_probs = permuted.new_empty((0,), dtype=acc)
    else:
        grad_probs = torch.zeros(row_id_map.shape, dtype=acc, device=permuted.device)
        grad_probs[tok, exp] = (g * permuted.index_select(0, rows).to(acc)).sum(-1)
        grad_probs = grad_probs.to(probs.dtype)
    return grad_permuted.to(permuted.dtype), grad_probs


moe_permute_index_op = define(
    "moe_permute_index(Tensor routing_map) -> (Tensor, Tensor)", moe_permute_index_reference
)
moe_permute_op = define(
    "moe_permute(Tensor tokens, Tensor sorted_indices, Tensor row_id_map) -> Tensor", moe_permute_reference
)
moe_unpermute_op = define(
    "moe_unpermute(Tensor permuted, Tensor row_id_map, Tensor? probs) -> Tensor", moe_unpermute_reference
)
moe_unpermute_backward_op = define(
    "moe_unpermute_backward(Tensor grad_out, Tensor permuted, Tensor row_id_map, Tensor? probs)"
    " -> (Tensor, Tensor)",
    moe_unpermute_backward_reference,
)


@torch.library.register_fake("mtmegatron::moe_permute_index")
def _(routing_map):
    num_out = torch.library.get_ctx().new_dynamic_size()
    return (
        routing_map.new_empty((num_out,), dtype=torch.int64),
        routing_map.new_empty(routing_map.shape, dtype=torch.int32),
    )


@torch.library.register_fake("mtmegatron::moe_permute")
def _(tokens, sorted_indices, row_id_map):
    return tokens.new_empty((sorted_indices.shape[0], tokens.shape[1]))


@torch.library.register_fake("mtmegatron::moe_unpermute")
def _(permuted, row_id_map, probs):
    return permuted.new_empty((row_id_map.shape[0], permuted.shape[1]))


@torch.library.register_fake("mtmegatron::moe_unpermute_backward")
def _(grad_out, permuted, row_id_map, probs):
    acc = _acc(permuted)
    if probs is None:
        grad_probs = permuted.new_empty((0,), dtype=acc)
    else:
        grad_probs = probs.new_empty(row_id_map.shape)
    return torch.empty_like(permuted), grad_probs


def _setup_permute(ctx, inputs, output):
    ctx.save_for_backward(inputs[2])


def _backward_permute(ctx, grad):
    (row_id_map,) = ctx.saved_tensors
    return moe_unpermute_op(grad, row_id_map, None), None, None


def _setup_unpermute(ctx, inputs, output):
    permuted, row_id_map, probs = inputs
    ctx.save_for_backward(permuted, row_id_map, probs)


def _backward_unpermute(ctx, grad):
    permuted, row_id_map, probs = ctx.saved_tensors
    grad_permuted, grad_probs = moe_unpermute_backward_op(grad, permuted, row_id_map, probs)
    return grad_permuted, None, grad_probs if probs is not None else None


torch.library.register_autograd("mtmegatron::moe_permute", _backward_permute, setup_context=_setup_permute)
torch.library.register_autograd("mtmegatron::moe_unpermute", _backward_unpermute, setup_context=_setup_unpermute)


def permute(
    tokens: torch.Tensor,
    routing_map: torch.Tensor,
    probs: Optional[torch.Tensor] = None,
    num_out_tokens: Optional[int] = None,
    fused: bool = True,
    drop_and_pad: bool = False,
):
    """megatron moe_utils.permute contract: returns (permuted_tokens, permuted_probs or None, sorted_indices)."""
    if drop_and_pad:
        from megatron.core.transformer.moe import moe_utils

        return moe_utils.permute(tokens, routing_map, probs, num_out_tokens, fused=False, drop_and_pad=True)
    sorted_indices, row_id_map = moe_permute_index_op(routing_map)
    permuted = moe_permute_op(tokens, sorted_indices, row_id_map)
    permuted_probs = None
    if probs is not None:
        permuted_probs = probs.T.contiguous().masked_select(routing_map.bool().T.contiguous())
    return permuted, permuted_probs, sorted_indices


def unpermute(
    permuted_tokens: torch.Tensor,
    sorted_indices: torch.Tensor,
    restore_shape: torch.Size,
    probs: Optional[torch.Tensor] = None,
    routing_map: Optional[torch.Tensor] = None,
    fused: bool = True,
    drop_and_pad: bool = False,
):
    """megatron moe_utils.unpermute contract (needs routing_map for the fused path)."""
    if drop_and_pad or routing_map is None:
        from megatron.core.transformer.moe import moe_utils

        return moe_utils.unpermute(
            permuted_tokens, sorted_indices, restore_shape, probs, routing_map, fused=False, drop_and_pad=drop_and_pad
        )
    _, row_id_map = moe_permute_index_op(routing_map)
    return moe_unpermute_op(permuted_tokens, row_id_map, probs)


# ---- TransformerEngine-compatible entry points (what megatron-core's moe_utils calls when
# config.moe_permute_fusion is on; bound there by patches/moe_fusion_without_te.py). The "sorted_indices" TE hands
# back is an opaque row map that only the matching unpermute reads: ours is the [tokens, experts] row_id_map.

def _check_num_out(permuted, num_out_tokens):
    if num_out_tokens is not None and int(num_out_tokens) not in (-1, permuted.shape[0]):
        raise ValueError(
            f"mtmegatron fused permute: num_out_tokens={int(num_out_tokens)} but the routing map selects "
            f"{permuted.shape[0]} rows (token dropping without padding is not supported; use drop-and-pad or "
            "moe_permute_fusion=False)"
        )


def fused_permute(tokens, routing_map, num_out_tokens=None):
    """TE `moe_permute(tokens, routing_map, num_out_tokens)` contract: (permuted [N, H], row_id_map)."""
    sorted_indices, row_id_map = moe_permute_index_op(routing_map)
    permuted = moe_permute_op(tokens, sorted_indices, row_id_map)
    _check_num_out(permuted, num_out_tokens)
    return permuted, row_id_map


def fused_permute_with_probs(tokens, probs, routing_map, num_out_tokens=None):
    """TE `moe_permute_with_probs` contract: (permuted tokens, permuted probs [N], row_id_map)."""
    permuted, row_id_map = fused_permute(tokens, routing_map, num_out_tokens)
    permuted_probs = probs.T.contiguous().masked_select(routing_map.bool().T.contiguous())
    return permuted, permuted_probs, row_id_map


def fused_unpermute(permuted_tokens, sorted_indices, merging_probs=None, restore_shape=None):
    """TE `moe_unpermute(inp, row_id_map, merging_probs, restore_shape)` contract; `sorted_indices` is the
    row_id_map returned by fused_permute. Sums (probability-weighted) expert outputs per token."""
    out = moe_unpermute_op(permuted_tokens, sorted_indices, merging_probs)
    return out if restore_shape is None else out.view(restore_shape)


def _chunk_rows(split_sizes, sorted_idxs, total):
    sizes = split_sizes.to(torch.long)
    starts = torch.cumsum(sizes, 0) - sizes
    order = sorted_idxs.to(device=sizes.device, dtype=torch.long)
    sizes_sorted, starts_sorted = sizes[order], starts[order]
    out_starts = torch.cumsum(sizes_sorted, 0) - sizes_sorted
    shift = torch.repeat_interleave(starts_sorted - out_starts, sizes_sorted, output_size=total)
    return shift + torch.arange(total, device=sizes.device)


def fused_sort_chunks_by_index(input, split_sizes, sorted_idxs):
    """TE `moe_sort_chunks_by_index` contract: reorder the row chunks of `input` (sizes `split_sizes`) into the
    order `sorted_idxs`, as one row gather (autograd through index_select). Python, no native kernel."""
    return input.index_select(0, _chunk_rows(split_sizes, sorted_idxs, input.shape[0]))


def fused_sort_chunks_by_index_with_probs(input, probs, split_sizes, sorted_idxs):
    rows = _chunk_rows(split_sizes, sorted_idxs, input.shape[0])
    return input.index_select(0, rows), probs.index_select(0, rows)
