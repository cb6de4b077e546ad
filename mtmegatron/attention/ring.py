"""Ring attention over the context-parallel group (``--cp-comm-type p2p``), with its own backward.

Each CP rank holds the load-balanced chunks ``r`` and ``2N-1-r`` of the sequence (megatron-core's layout,
``get_batch_on_this_cp_rank``). Forward: key/value blocks travel once around the ring (send to rank r+1,
receive from r-1, overlapped with compute); each (query chunk, key chunk) pair is attended with
``blocks.block_forward`` — fully when the key chunk is earlier, causally on the diagonal, skipped when later —
and the partial outputs are merged by log-sum-exp. A sliding window masks the pairs by global positions (pairs
it empties are skipped, pairs it cuts run the math block with the band mask); a sink is merged once at the end as
a block with log-sum-exp ``sink`` and no value, its gradient ``-sum(p_sink * rowsum(dO * O))``. Backward: the same ring again with the saved final output
and LSE; dK/dV accumulators travel with their key/value block and are sent home after the last step.
Only the local q/k/v, the output and the LSE are saved: memory stays O(local sequence).
May assume: torch.distributed is initialised; tensors ``[b, heads, s_local, d]`` with ``s_local`` even.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from mtmegatron.attention.blocks import _acc_dtype, _causal_mask, block_backward, block_forward, merge
from mtmegatron.attention.window_sink import block_allowed, sink_lse

# gloo pairs a receive with the oldest message from the same peer and tag: forward and backward traffic
# get their own tags (with CP=2 the previous and next rank are the same peer).
FORWARD_TAG, BACKWARD_TAG = 61, 62


def _chunk_ids(rank: int, size: int) -> tuple[int, int]:
    return rank, 2 * size - 1 - rank


def _pairs(q_ids, kv_ids, causal: bool, window=None, chunk: int = 0, device=None):
    """(q half, kv half, causal diagonal?, mask or None) for every pair that attends. With a sliding window the
    pair's mask is computed on the chunks' global positions (on the host, so skipping needs no device sync): a
    pair the window leaves empty is skipped, a whole or plain causal one keeps the fused kernel, a cut one gets
    its mask (True = may attend)."""
    for i, a in enumerate(q_ids):
        for j, b in enumerate(kv_ids):
            if window is None:
                if not causal or b < a:
                    yield i, j, False, None
                elif b == a:
                    yield i, j, True, None
                continue
            allowed = block_allowed(a * chunk, chunk, b * chunk, chunk, window, causal, "cpu")
            if not allowed.any():
                continue
            if allowed.all():
                yield i, j, False, None
            elif a == b and torch.equal(allowed, ~_causal_mask(chunk, chunk, "cpu")):
                yield i, j, True, None
            else:
                yield i, j, False, allowed.to(device)


def _exchange(send: torch.Tensor, group, tag: int) -> tuple[torch.Tensor, list]:
    """Start sending ``send`` to the next rank and receiving the previous rank's into a new buffer."""
    rank, size = group.rank(), group.size()
    nxt = dist.get_global_rank(group, (rank + 1) % size)
    prv = dist.get_global_rank(group, (rank - 1) % size)
    recv = torch.empty_like(send)
    ops = [dist.P2POp(dist.isend, send, nxt, group, tag), dist.P2POp(dist.irecv, recv, prv, group, tag)]
    return recv, dist.batch_isend_irecv(ops)


def _pack(*tensors: torch.Tensor) -> torch.Tensor:
    return torch.cat([t.reshape(-1) for t in tensors])


def _unpack(flat: torch.Tensor, like: tuple[torch.Tensor, ...]) -> list[torch.Tensor]:
    out, offset = [], 0
    for t in like:
        out.append(flat[offset: offset + t.numel()].view(t.shape))
        offset += t.numel()
    return out


def _halves(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return t.chunk(2, dim=2)


class RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, sink, causal: bool, scale: float, group, window):
        rank, size = group.rank(), group.size()
        q_ids = _chunk_ids(rank, size)
        b, hq, s, _ = q.shape
        acc = _acc_dtype(q.dtype)
        out_acc = torch.zeros(b, hq, s, v.shape[-1], dtype=acc, device=q.device)
        lse_acc = torch.full((b, hq, s), float("-inf"), dtype=acc, device=q.device)
        out_halves, lse_halves, q_halves = _halves(out_acc), _halves(lse_acc), _halves(q)
        kv = _pack(k, v)
        for step in range(size):
            pending = []
            if step < size - 1:
                incoming, pending = _exchange(kv, group, FORWARD_TAG)
            k_cur, v_cur = _unpack(kv, (k, v))
            kv_ids = _chunk_ids((rank - step) % size, size)
            k_halves, v_halves = _halves(k_cur), _halves(v_cur)
            for i, j, diagonal, allowed in _pairs(q_ids, kv_ids, causal, window, s // 2, q.device):
                out, lse = block_forward(q_halves[i], k_halves[j], v_halves[j], diagonal, scale, allowed)
                merge(out_halves[i], lse_halves[i], out, lse.to(acc))
            for work in pending:
                work.wait()
            if step < size - 1:
                kv = incoming
        if sink is not None:  # the sink is one more block: no value, log-sum-exp = the sink logit
            merge(out_acc, lse_acc, torch.zeros_like(out_acc), sink_lse(sink, lse_acc))
        out = out_acc.to(q.dtype)
        ctx.save_for_backward(q, k, v, out, lse_acc, sink)
        ctx.causal, ctx.scale, ctx.group, ctx.window = causal, scale, group, window
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse, sink = ctx.saved_tensors
        group, causal, scale, window = ctx.group, ctx.causal, ctx.scale, ctx.window
        rank, size = group.rank(), group.size()
        q_ids = _chunk_ids(rank, size)
        acc = _acc_dtype(q.dtype)
        dq = torch.zeros_like(q, dtype=acc)
        dk = torch.zeros_like(k, dtype=acc)
        dv = torch.zeros_like(v, dtype=acc)
        dq_h, q_h, o_h, do_h = _halves(dq), _halves(q), _halves(out), _halves(dout.contiguous())
        lse_h = _halves(lse.to(torch.float64 if q.dtype == torch.float64 else torch.float32))
        kv = _pack(k, v)
        for step in range(size):
            pending = []
            if step < size - 1:
                incoming, pending = _exchange(kv, group, BACKWARD_TAG)
            k_cur, v_cur = _unpack(kv, (k, v))
            kv_ids = _chunk_ids((rank - step) % size, size)
            k_halves, v_halves = _halves(k_cur), _halves(v_cur)
            dk_h, dv_h = _halves(dk), _halves(dv)
            for i, j, diagonal, allowed in _pairs(q_ids, kv_ids, causal, window, q.shape[2] // 2, q.device):
                gq, gk, gv = block_backward(do_h[i], q_h[i], k_halves[j], v_halves[j], o_h[i], lse_h[i],
                                            diagonal, scale, allowed)
                dq_h[i].add_(gq)
                dk_h[j].add_(gk)
                dv_h[j].add_(gv)
            for work in pending:
                work.wait()
            # the dK/dV accumulated so far for this block follow it to the next rank
            dkv, dkv_pending = _exchange(_pack(dk, dv), group, BACKWARD_TAG + 1)
            for work in dkv_pending:
                work.wait()
            dk, dv = _unpack(dkv, (dk, dv))
            if step < size - 1:
                kv = incoming
        dsink = None
        if sink is not None:  # d lse_sink = -p_sink * rowsum(dO * O) (the sink's value is zero)
            delta = (dout.to(acc) * out.to(acc)).sum(-1)
            dsink = -(torch.exp(sink_lse(sink, lse) - lse.to(acc)) * delta).sum((0, 2)).to(sink.dtype)
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), dsink, None, None, None, None


def ring_attention(q, k, v, causal: bool, scale: float, group, window=None, sink=None) -> torch.Tensor:
    """Attention of this rank's load-balanced query chunks over the whole sequence; ``[b, hq, s_local, dv]``.
    ``window``/``sink``: window_sink.py's, on global positions; the sink is merged once, after every block."""
    return RingAttention.apply(q, k, v, sink, causal, scale, group, window)
