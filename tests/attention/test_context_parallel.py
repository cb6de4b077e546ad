"""Context-parallel attention (ring and all-gather) against single-device float64 attention, on every backend.

Each rank holds megatron's load-balanced chunks r and 2N-1-r of q/k/v; its output and its q/k/v gradients
must equal the matching rows of full-sequence attention (explicit softmax, float64) and its gradients.
Cases: causal GQA, causal MLA head dims (q/k 12, v 8), non-causal, float32; ring with torch's CPU flash
kernel and with the explicit block kernel, and all-gather. CP=2 and CP=4 (the ring's previous and next rank
differ only from 4 on). Tolerance: 1e-10 absolute in float64 (measured ~1e-15), 2e-5 in float32.
"""

from __future__ import annotations

import pytest
import torch

from helpers.ranks import run_ranks

CASES = {  # name: (hq, hk, dk, dv, causal, dtype)
    "causal_gqa": (4, 2, 8, 8, True, torch.float64),
    "causal_mla_dims": (2, 2, 12, 8, True, torch.float64),
    "no_mask": (4, 2, 8, 8, False, torch.float64),
    "causal_fp32": (4, 2, 8, 8, True, torch.float32),
}
TOL = {torch.float64: 1e-10, torch.float32: 2e-5}


def _reference(q, k, v, dout, causal, scale):
    q, k, v = (t.detach().double().requires_grad_() for t in (q, k, v))
    groups = q.shape[1] // k.shape[1]
    scores = q @ k.repeat_interleave(groups, 1).transpose(-1, -2) * scale
    if causal:
        s = q.shape[2]
        scores = scores.masked_fill(torch.ones(s, s, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    out = torch.softmax(scores, -1) @ v.repeat_interleave(groups, 1)
    out.backward(dout.double())
    return out, q.grad, k.grad, v.grad


def _local(t, rank, size):
    """Rows of chunks rank and 2*size-1-rank along the sequence dim (2) of [b, h, s, d]."""
    chunks = t.chunk(2 * size, dim=2)
    return torch.cat([chunks[rank], chunks[2 * size - 1 - rank]], dim=2)


def _cp_worker(rank, world_size, backend_name):
    from datetime import timedelta

    import torch.distributed as dist

    import mtmegatron
    from mtmegatron.attention import blocks
    from mtmegatron.attention.all_gather import all_gather_attention
    from mtmegatron.attention.ring import ring_attention

    backend = mtmegatron.activate(backend_name)
    backend.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world_size, timeout=timedelta(seconds=60))
    device = torch.cuda.current_device()
    group = dist.group.WORLD
    errors = {}
    for name, (hq, hk, dk, dv, causal, dtype) in CASES.items():
        g = torch.Generator().manual_seed(11)
        s = 4 * world_size  # two chunks of 2 rows per rank
        q, k, v = (torch.randn(2, h, s, d, generator=g, dtype=dtype).to(device)
                   for h, d in ((hq, dk), (hk, dk), (hk, dv)))
        dout = torch.randn(2, hq, s, dv, generator=g, dtype=dtype).to(device)
        scale = dk ** -0.5
        expected = _reference(q, k, v, dout, causal, scale)
        variants = {"ring_flash": (ring_attention, True), "ring_blocks": (ring_attention, False),
                    "all_gather": (all_gather_attention, True)}
        for variant, (attend, flash) in variants.items():
            blocks.USE_FUSED = flash
            lq, lk, lv = (_local(t, rank, world_size).clone().requires_grad_() for t in (q, k, v))
            out = attend(lq, lk, lv, causal, scale, group)
            out.backward(_local(dout, rank, world_size))
            got = (out, lq.grad, lk.grad, lv.grad)
            errors[f"{name}/{variant}"] = max(
                (a.double() - _local(e, rank, world_size)).abs().max().item() for a, e in zip(got, expected))
    return errors


@pytest.mark.parametrize("world_size", [2, 4])
def test_cp_attention_matches_full_attention(backend_name, world_size):
    per_rank = run_ranks(_cp_worker, world_size, backend_name, timeout=180)
    for rank, errors in enumerate(per_rank):
        for key, error in errors.items():
            dtype = CASES[key.split("/")[0]][5]
            assert error < TOL[dtype], f"rank {rank} {key}: max abs difference {error:.2e} > {TOL[dtype]}"
    print({k: max(r[k] for r in per_rank) for k in per_rank[0]})
