"""Parallel equivalence, the strongest check of the stack: one initial checkpoint, loaded into every layout,
same global batches, fp32, dropout 0 -> the per-iteration losses of 10 iterations match the single-rank run.

Tolerance: 1e-4 relative per iteration (measured differences are ~1e-7: only reduction order differs).
Each layout is a real ``torchrun -m mtmegatron.pretrain`` launch on the cpu backend (gloo).
"""

from __future__ import annotations

import pytest

from helpers.pretrain_runner import TINY, run_pretrain

ITERS = 10
RTOL = 1e-4

DENSE_LAYOUTS = {
    "tp2_sp": (2, ["--tensor-model-parallel-size", "2", "--sequence-parallel"]),
    "pp2": (2, ["--pipeline-model-parallel-size", "2"]),
    "pp2_vpp2": (2, ["--pipeline-model-parallel-size", "2", "--num-layers-per-virtual-pipeline-stage", "1"]),
    "dp2_distopt": (2, ["--use-distributed-optimizer"]),
    # uneven stages (1 + 3 layers) and the embedding/loss counted as layers ((4 + 2) / 2: 2 + 2 layers)
    "pp2_first1": (2, ["--pipeline-model-parallel-size", "2", "--decoder-first-pipeline-num-layers", "1"]),
    "pp2_account": (2, ["--pipeline-model-parallel-size", "2", "--account-for-embedding-in-pipeline-split",
                        "--account-for-loss-in-pipeline-split"]),
    "tp2_pp2": (4, ["--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2",
                    "--sequence-parallel"]),
}
# Mixtral-style MoE; aux-loss coefficient 0 because megatron-core's aux loss is computed per data-parallel
# shard (a different objective under DP), which is not what this test is about.
MOE = ["--model", "mixtral", "--num-experts", "4", "--moe-router-topk", "2", "--moe-aux-loss-coeff", "0",
       "--moe-token-dispatcher-type", "alltoall"]
MOE_LAYOUTS = {
    "ep2": (2, ["--expert-model-parallel-size", "2"]),
    "ep2_tp2": (4, ["--expert-model-parallel-size", "2", "--tensor-model-parallel-size", "2",
                    "--sequence-parallel"]),
}


def _reference(tmp_path_factory, name: str, extra: list[str]):
    root = tmp_path_factory.mktemp(name)
    run_pretrain(1, TINY + extra + ["--train-iters", "0", "--save", str(root / "init")], root / "init_log")
    args = TINY + extra + ["--train-iters", str(ITERS), "--load", str(root / "init"), "--finetune"]
    _, rows = run_pretrain(1, args, root / "single")
    losses = [r["loss"] for r in rows]
    assert len(losses) == ITERS
    assert losses[-1] < losses[0] - 0.1, f"reference run did not learn: {losses}"
    return root, args, losses


@pytest.fixture(scope="module")
def dense_reference(tmp_path_factory):
    return _reference(tmp_path_factory, "dense", [])


@pytest.fixture(scope="module")
def moe_reference(tmp_path_factory):
    return _reference(tmp_path_factory, "moe", MOE)


def _assert_same_curve(reference: list[float], losses: list[float], layout: str) -> None:
    assert len(losses) == len(reference), f"{layout}: {len(losses)} iterations logged, expected {len(reference)}"
    worst = max(abs(a - b) / abs(a) for a, b in zip(reference, losses))
    assert worst <= RTOL, f"{layout}: max relative loss difference {worst:.2e} > {RTOL}\n{reference}\n{losses}"


CASES = [("dense_reference", DENSE_LAYOUTS, name) for name in DENSE_LAYOUTS] + [
    ("moe_reference", MOE_LAYOUTS, name) for name in MOE_LAYOUTS
]


@pytest.mark.parametrize("reference_fixture,layouts,layout", CASES, ids=[case[2] for case in CASES])
def test_layout_matches_single_rank(request, reference_fixture, layouts, layout):
    root, args, reference = request.getfixturevalue(reference_fixture)
    nproc, extra = layouts[layout]
    _, rows = run_pretrain(nproc, args + extra, root / layout)
    _assert_same_curve(reference, [r["loss"] for r in rows], layout)
