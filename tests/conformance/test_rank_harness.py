"""The N-rank harness in tests/conftest.py must report every failing rank (else the parallel tests could
pass while a rank died). Uses the cpu start method and no process group, so it costs well under a second."""

from __future__ import annotations

import os

import pytest
import torch


def _rank_values(rank, world_size, backend_name, offset):
    return {"rank": rank, "world_size": world_size, "backend": backend_name,
            "env": (os.environ["RANK"], os.environ["WORLD_SIZE"], os.environ["LOCAL_RANK"]),
            "tensor": torch.full((2,), float(rank + offset))}


def _rank_one_raises(rank, world_size, backend_name):
    if rank == 1:
        raise ValueError("rank one is broken")
    return rank


def _rank_zero_dies(rank, world_size, backend_name):
    if rank == 0:
        os._exit(3)
    return rank


def test_results_come_back_in_rank_order(run_ranks):
    results = run_ranks(_rank_values, 3, "cpu", 10)
    assert [r["rank"] for r in results] == [0, 1, 2]
    assert [r["env"] for r in results] == [(str(i), "3", str(i)) for i in range(3)]
    assert all(r["world_size"] == 3 and r["backend"] == "cpu" for r in results)
    assert [r["tensor"].tolist() for r in results] == [[10.0, 10.0], [11.0, 11.0], [12.0, 12.0]]


def test_an_exception_on_one_rank_fails_the_test(run_ranks):
    with pytest.raises(pytest.fail.Exception, match=r"(?s)1/2 ranks.*rank 1.*ValueError: rank one is broken"):
        run_ranks(_rank_one_raises, 2, "cpu")


def test_a_dead_rank_fails_the_test(run_ranks):
    with pytest.raises(pytest.fail.Exception, match=r"(?s)rank 0.*exited with code 3"):
        run_ranks(_rank_zero_dies, 2, "cpu", timeout=30)
