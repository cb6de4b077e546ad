"""Packed (THD) sequences under context parallelism: the per-rank split and the attention on it.

- ``thd_partition_index`` against a hand-computed layout (sequences of 8 and 4 positions, CP 2: rank 0 holds
  chunks 0 and 3 of each, rank 1 chunks 1 and 2), and the ranks' indices together cover the row once;
- ``packed_batch`` with a multiple pads each conversation to it (loss-free pads, real ``cu_seqlens`` kept);
- ``thd_cp_attention`` on real gloo ranks (CP 2 and 4): each rank's output and q/k/v gradients equal the
  matching rows of float64 attention computed sequence by sequence on one device (causal GQA, and no mask),
  so no row sees another sequence. Tolerance 1e-10 in float64.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from helpers.ranks import run_ranks
from mtmegatron.attention.cp_batch import thd_partition_index
from mtmegatron.sft.packing import packed_batch


def test_thd_partition_index_by_hand():
    cu = torch.tensor([0, 8, 12], dtype=torch.int32)
    assert thd_partition_index(cu, 2, 0).tolist() == [0, 1, 6, 7, 8, 11]
    assert thd_partition_index(cu, 2, 1).tolist() == [2, 3, 4, 5, 9, 10]
    assert thd_partition_index(cu, 1, 0).tolist() == list(range(12))
    cu4 = torch.tensor([0, 16, 24, 32], dtype=torch.int32)
    held = torch.cat([thd_partition_index(cu4, 4, r) for r in range(4)])
    assert sorted(held.tolist()) == list(range(32))
    assert thd_partition_index(cu4, 4, 1).tolist() == [2, 3, 12, 13, 17, 22, 25, 30]


def test_packed_batch_pads_each_conversation_to_the_multiple():
    a = (np.array([5, 6, 7, 8, 9, 10]), np.array([0, 0, 1, 1, 1, 1], bool))  # 5 positions -> 8
    b = (np.array([11, 12, 13]), np.array([0, 1, 1], bool))  # 2 positions -> 4
    batch = packed_batch([[a, b]], 16, pad_id=0, multiple=4)
    assert batch["cu_seqlens"].tolist() == [0, 5, 7, 11]
    assert batch["cu_seqlens_padded"].tolist() == [0, 8, 12, 16]
    assert batch["max_seqlen"] == 8
    assert batch["tokens"][0].tolist() == [5, 6, 7, 8, 9, 0, 0, 0, 11, 12, 0, 0, 0, 0, 0, 0]
    assert batch["labels"][0].tolist() == [6, 7, 8, 9, 10, 0, 0, 0, 12, 13, 0, 0, 0, 0, 0, 0]
    assert batch["loss_mask"][0].tolist() == [0, 1, 1, 1, 1, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0]
    assert batch["position_ids"][0].tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 0, 1, 2, 3]
    assert "cu_seqlens_padded" not in packed_batch([[a, b]], 16, pad_id=0)


def _reference(q, k, v, dout, cu, causal, scale):
    """[t, h, d] float64 attention sequence by sequence, and its gradients."""
    q, k, v = (t.detach().double().requires_grad_() for t in (q, k, v))
    groups = q.shape[1] // k.shape[1]
    outs = []
    for start, end in zip(cu[:-1], cu[1:]):
        qs, ks, vs = (t[start:end].transpose(0, 1) for t in (q, k, v))
        scores = qs @ ks.repeat_interleave(groups, 0).transpose(-1, -2) * scale
        if causal:
            n = end - start
            scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
        outs.append((torch.softmax(scores, -1) @ vs.repeat_interleave(groups, 0)).transpose(0, 1))
    out = torch.cat(outs)
    out.backward(dout.double())
    return out, q.grad, k.grad, v.grad


def _thd_cp_worker(rank, world_size, backend_name):
    from datetime import timedelta

    import torch.distributed as dist

    import mtmegatron
    from mtmegatron.attention.thd_cp import thd_cp_attention

    backend = mtmegatron.activate(backend_name)
    backend.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world_size, timeout=timedelta(seconds=60))
    device = torch.cuda.current_device()
    unit = 2 * world_size
    cu = [0, 3 * unit, 4 * unit, 6 * unit]  # three sequences of different lengths
    index = thd_partition_index(torch.tensor(cu), world_size, rank)
    errors = {}
    for causal in (True, False):
        g = torch.Generator().manual_seed(5)
        q, k, v = (torch.randn(cu[-1], h, 8, generator=g, dtype=torch.float64) for h in (4, 2, 2))
        dout = torch.randn(cu[-1], 4, 8, generator=g, dtype=torch.float64)
        expected = _reference(q, k, v, dout, cu, causal, 8 ** -0.5)
        lq, lk, lv = (t[index].to(device).requires_grad_() for t in (q, k, v))
        out = thd_cp_attention(lq, lk, lv, torch.tensor(cu, dtype=torch.int32, device=device), causal, 8 ** -0.5,
                               dist.group.WORLD)
        out.backward(dout[index].to(device))
        got = (out, lq.grad, lk.grad, lv.grad)
        errors["causal" if causal else "no_mask"] = max(
            (a.detach().cpu() - e.detach()[index]).abs().max().item() for a, e in zip(got, expected))
    return errors


@pytest.mark.parametrize("world_size", [2, 4])
def test_thd_cp_attention_matches_per_sequence_attention(backend_name, world_size):
    per_rank = run_ranks(_thd_cp_worker, world_size, backend_name, timeout=180)
    for rank, errors in enumerate(per_rank):
        for key, error in errors.items():
            assert error < 1e-10, f"rank {rank} {key}: max abs difference {error:.2e}"
