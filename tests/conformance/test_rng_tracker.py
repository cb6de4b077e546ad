"""Conformance: megatron-core's own RNG tracker (``tensor_parallel.random``) on every backend.

In-process: fork() draws from the tracker's stream, leaves the default stream exactly where it was, and
consecutive forks continue the tracker's stream. Four spawned ranks (TP=2 x DP=2): what
``model_parallel_cuda_manual_seed``'s docstring promises, checked against dropout masks from every rank:
- default state: "the same among a set of model parallel GPUs" (megatron-core seeds it with ``seed`` on every
  rank, so with one seed it is the same on all ranks);
- tensor-model-parallel state (``fork()``): "different among a set of model parallel GPUs, but the same
  across data parallel groups";
- expert-parallel state: "different among expert-tensor and expert-model parallel GPUs, and the same across
  expert-data parallel groups" (expert TP defaults to TP here, EP=1);
- data-parallel tracker state: seeded with ``seed`` itself, so it starts where the default state started.
"""

from __future__ import annotations

import logging

import numpy as np
import torch
import torch.nn.functional as F

_SEED = 1234
_N = 4096


def _mask() -> torch.Tensor:
    return (F.dropout(torch.ones(_N, device="cuda"), p=0.5, training=True) != 0).cpu()


def _seed(seed: int = _SEED) -> None:
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    model_parallel_cuda_manual_seed(seed, tp_rank=0, ep_rank=0, etp_rank=0)


def test_fork_uses_its_own_stream_and_restores_the_default(activated, caplog):
    from megatron.core.tensor_parallel.random import get_cuda_rng_tracker

    with caplog.at_level(logging.WARNING):
        _seed()
        a1 = _mask()
        with get_cuda_rng_tracker().fork():
            forked = _mask()
        a2 = _mask()
    assert "CPU RNG state changed within GPU RNG context" not in caplog.text

    _seed()  # the same program without the fork
    b1, b2 = _mask(), _mask()
    assert torch.equal(a1, b1), "seeding is not reproducible"
    assert torch.equal(a2, b2), "the default stream after fork() differs from a run without the fork"
    assert not torch.equal(forked, a1) and not torch.equal(forked, a2), "fork() drew from the default stream"
    assert 0.4 < forked.float().mean().item() < 0.6


def test_consecutive_forks_continue_the_tracker_stream(activated):
    from megatron.core.tensor_parallel.random import get_cuda_rng_tracker

    tracker = get_cuda_rng_tracker()
    _seed()
    with tracker.fork():
        m1 = _mask()
    between = _mask()
    with tracker.fork():
        m2 = _mask()

    _seed()
    with tracker.fork():
        c1, c2 = _mask(), _mask()
    assert not torch.equal(m1, m2), "the second fork() repeated the first fork's numbers"
    assert torch.equal(m1, c1) and torch.equal(m2, c2), "forks do not continue one tracker stream"
    _seed()
    assert torch.equal(between, _mask()), "the default stream was disturbed by the first fork"


def test_tracker_states_are_distinct_and_data_parallel_state_starts_at_seed(activated):
    from megatron.core.tensor_parallel.random import (
        get_cuda_rng_tracker,
        get_data_parallel_rng_tracker_name,
        get_expert_parallel_rng_tracker_name,
    )

    tracker = get_cuda_rng_tracker()
    _seed()
    default = _mask()
    with tracker.fork(get_data_parallel_rng_tracker_name()):
        data_parallel = _mask()
    with tracker.fork():
        model_parallel = _mask()
    with tracker.fork(get_expert_parallel_rng_tracker_name()):
        expert = _mask()
    assert torch.equal(default, data_parallel), "data-parallel state is not seeded with `seed`"
    assert not torch.equal(default, model_parallel)
    assert not torch.equal(model_parallel, expert)


# ---- four ranks: TP=2, DP=2 -------------------------------------------------------------------------------
def _tp2_dp2_worker(rank, world_size, backend_name):
    import torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.random import (
        get_cuda_rng_tracker,
        get_data_parallel_rng_tracker_name,
        get_expert_parallel_rng_tracker_name,
        model_parallel_cuda_manual_seed,
    )

    import mtmegatron

    backend = mtmegatron.activate(backend_name)
    backend.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world_size)
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=2)
    try:
        model_parallel_cuda_manual_seed(_SEED)
        tracker = get_cuda_rng_tracker()
        default = _mask()
        with tracker.fork():
            tensor_parallel = _mask()
        with tracker.fork(get_expert_parallel_rng_tracker_name()):
            expert = _mask()
        with tracker.fork(get_data_parallel_rng_tracker_name()):
            data_parallel = _mask()
        after = _mask()
        return dict(
            tp_rank=parallel_state.get_tensor_model_parallel_rank(),
            dp_rank=parallel_state.get_data_parallel_rank(),
            tp_group_backend=dist.get_backend(parallel_state.get_tensor_model_parallel_group()),
            default=default, tensor_parallel=tensor_parallel, expert=expert, data_parallel=data_parallel,
            after=after,
        )
    finally:
        parallel_state.destroy_model_parallel()


def test_tp2_dp2_rng_semantics(backend, run_ranks):
    results = run_ranks(_tp2_dp2_worker, 4, backend.name)
    layout = {(r["dp_rank"], r["tp_rank"]): r for r in results}
    assert sorted(layout) == [(0, 0), (0, 1), (1, 0), (1, 1)], f"unexpected TP/DP layout: {sorted(layout)}"
    assert {r["tp_group_backend"] for r in results} == {backend.dist_backend}

    def same(a, b, key):
        return np.array_equal(layout[a][key], layout[b][key])

    for dp in (0, 1):  # within a TP group (same DP rank, different TP rank)
        assert not same((dp, 0), (dp, 1), "tensor_parallel"), "fork() masks equal across TP ranks"
        assert not same((dp, 0), (dp, 1), "expert"), "expert-parallel masks equal across expert-TP ranks"
        assert same((dp, 0), (dp, 1), "default"), "default-state masks differ inside a TP group"
        assert same((dp, 0), (dp, 1), "after")
    for tp in (0, 1):  # across DP ranks (same TP rank)
        assert same((0, tp), (1, tp), "tensor_parallel"), "fork() masks differ across DP ranks"
        assert same((0, tp), (1, tp), "expert"), "expert-parallel masks differ across expert-DP ranks"
    for key in ("default", "data_parallel", "after"):  # one seed: default and DP states agree everywhere
        assert all(same((0, 0), other, key) for other in layout), f"'{key}' masks differ across ranks"
    first = layout[(0, 0)]
    assert np.array_equal(first["default"], first["data_parallel"])
    assert not np.array_equal(first["default"], first["after"])
