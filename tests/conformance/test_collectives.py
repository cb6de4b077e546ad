"""Conformance: every collective megatron-core relies on, against hand-computed results, in spawned process
groups of the backend's collective library (world sizes 2 and 4), plus the "nccl" -> backend mapping of
``init_process_group``/``new_group``. One spawn per world size runs every check.
"""

from __future__ import annotations

from datetime import timedelta

import numpy as np
import pytest
import torch


def _expected(rank: int, world_size: int) -> dict:
    """What each collective in _collectives_worker must produce on ``rank``, computed by hand."""
    ws, r = world_size, rank
    nxt, prv = (r + 1) % ws, (r - 1) % ws
    expected = {
        "all_reduce_sum": [ws * (ws + 1) / 2, ws * (ws + 1)],
        "all_reduce_max": [ws - 1, 0],
        "all_gather": [[float(j)] * 3 for j in range(ws)],
        "all_gather_into_tensor": [10.0 * j + k for j in range(ws) for k in range(2)],
        "reduce_scatter_tensor": [(2 * r + k) * ws * (ws + 1) / 2 for k in range(2)],
        "all_to_all_equal": [100.0 * j + 2 * r + k for j in range(ws) for k in range(2)],
        # rank j sends (j + 1 + r) elements of value 100*j + r to rank r
        "all_to_all_unequal": [100.0 * j + r for j in range(ws) for _ in range(j + 1 + r)],
        "broadcast": [float(ws - 1)] * 4,
        "send_recv_ring": [float(prv)] * 3,
        "batch_isend_irecv": {"from_prev": [float(prv)] * 2, "from_next": [float(nxt) + 0.5] * 2},
    }
    if ws == 1:
        del expected["send_recv_ring"], expected["batch_isend_irecv"]
    return expected


def _collectives_worker(rank, world_size, backend_name):
    import torch.distributed as dist

    import mtmegatron

    backend = mtmegatron.activate(backend_name)
    backend.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world_size, timeout=timedelta(seconds=60))
    dev = torch.cuda.current_device()  # megatron's idiom; on the cpu backend this means the host
    ws, r = world_size, rank
    nxt, prv = (r + 1) % ws, (r - 1) % ws
    out = {"default_backend": dist.get_backend()}

    t = torch.tensor([r + 1.0, 2.0 * (r + 1)], device=dev)
    dist.all_reduce(t)
    out["all_reduce_sum"] = t
    t = torch.tensor([float(r), -float(r)], device=dev)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    out["all_reduce_max"] = t

    parts = [torch.empty(3, device=dev) for _ in range(ws)]
    dist.all_gather(parts, torch.full((3,), float(r), device=dev))
    out["all_gather"] = torch.stack(parts)
    gathered = torch.empty(2 * ws, device=dev)
    dist.all_gather_into_tensor(gathered, torch.arange(2, dtype=torch.float32, device=dev) + 10 * r)
    out["all_gather_into_tensor"] = gathered

    scattered = torch.empty(2, device=dev)
    dist.reduce_scatter_tensor(scattered, torch.arange(2 * ws, dtype=torch.float32, device=dev) * (r + 1))
    out["reduce_scatter_tensor"] = scattered

    received = torch.empty(2 * ws, device=dev)
    dist.all_to_all_single(received, torch.arange(2 * ws, dtype=torch.float32, device=dev) + 100 * r)
    out["all_to_all_equal"] = received
    in_splits = [r + 1 + j for j in range(ws)]
    out_splits = [j + 1 + r for j in range(ws)]
    send = torch.cat([torch.full((n,), 100.0 * r + j, device=dev) for j, n in enumerate(in_splits)])
    received = torch.empty(sum(out_splits), device=dev)
    dist.all_to_all_single(received, send, output_split_sizes=out_splits, input_split_sizes=in_splits)
    out["all_to_all_unequal"] = received

    t = torch.full((4,), float(r), device=dev)
    dist.broadcast(t, src=ws - 1)
    out["broadcast"] = t

    if ws > 1:  # point-to-point needs a peer (gloo cannot send to itself)
        got = torch.empty(3, device=dev)
        mine = torch.full((3,), float(r), device=dev)
        if r % 2 == 0:  # even ranks send first: blocking P2P around the ring cannot deadlock
            dist.send(mine, dst=nxt)
            dist.recv(got, src=prv)
        else:
            dist.recv(got, src=prv)
            dist.send(mine, dst=nxt)
        out["send_recv_ring"] = got

        # megatron's pipeline p2p_communication: one batch with sends/recvs in both directions
        from_prev, from_next = torch.empty(2, device=dev), torch.empty(2, device=dev)
        ops = [
            dist.P2POp(dist.isend, torch.full((2,), float(r), device=dev), nxt),
            dist.P2POp(dist.isend, torch.full((2,), r + 0.5, device=dev), prv),
            dist.P2POp(dist.irecv, from_prev, prv),
            dist.P2POp(dist.irecv, from_next, nxt),
        ]
        for req in dist.batch_isend_irecv(ops):
            req.wait()
        out["batch_isend_irecv"] = {"from_prev": from_prev, "from_next": from_next}

    # process-group creation: "nccl" means the backend's library, explicit "gloo" stays gloo
    ranks = list(range(ws))
    out["new_group_nccl_kw"] = dist.get_backend(dist.new_group(ranks, backend="nccl"))
    out["new_group_nccl_positional"] = dist.get_backend(dist.new_group(ranks, timedelta(seconds=60), "nccl"))
    gloo = dist.new_group(ranks, backend="gloo")
    out["new_group_gloo"] = dist.get_backend(gloo)
    t = torch.tensor([float(r)])
    dist.all_reduce(t, group=gloo)
    out["gloo_group_all_reduce"] = t
    dist.barrier()
    return out


# world size 1 is what a one-GPU machine can run with NCCL (one rank per device); 2 and 4 need that many.
@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_collectives(backend, run_ranks, world_size):
    results = run_ranks(_collectives_worker, world_size, backend.name)
    problems = []
    for rank, got in enumerate(results):
        for name, want in _expected(rank, world_size).items():
            if isinstance(want, dict):
                pairs = [(f"{name}.{k}", got[name][k], v) for k, v in want.items()]
            else:
                pairs = [(name, got[name], want)]
            for label, actual, wanted in pairs:
                if not np.allclose(np.asarray(actual, dtype=np.float64), np.asarray(wanted, dtype=np.float64)):
                    problems.append(f"rank {rank} {label}: got {np.asarray(actual).tolist()} want {wanted}")
        assert got["gloo_group_all_reduce"].tolist() == [world_size * (world_size - 1) / 2]
        backends = {k: got[k] for k in ("default_backend", "new_group_nccl_kw", "new_group_nccl_positional")}
        if set(backends.values()) != {backend.dist_backend}:
            problems.append(f"rank {rank}: 'nccl' groups are {backends}, want '{backend.dist_backend}'")
        if got["new_group_gloo"] != "gloo":
            problems.append(f"rank {rank}: an explicit gloo group became {got['new_group_gloo']}")
    assert not problems, "\n".join(problems)
