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


# --moe-grouped-gemm (megatron-core's GroupedMLP over mtmegatron.ops.grouped_mm): the sequential run's initial
# checkpoint loads into the grouped layout (megatron's sharded_state_dict converts the expert weights); the first
# GROUPED_ITERS losses equal those of the sequential experts in the same layout (the single-rank run for EP1, the
# MOE_LAYOUTS run, shared with the test above, otherwise) within GROUPED_ATOL (fp32). Measured: identical losses
# under EP1, EP2 and EP2xTP2 (without the grouped_mlp_tp_attributes patch EP2xTP2 was 1.9e-4 off by iteration 4).
GROUPED_ITERS = 4
GROUPED_ATOL = 1e-5
GROUPED_LAYOUTS = {  # name -> (sequential layout to compare with, None = single rank; extra flags)
    "ep1_grouped": (None, ["--moe-grouped-gemm"]),
    "ep2_grouped": ("ep2", ["--moe-grouped-gemm"]),
    "ep2_tp2_grouped": ("ep2_tp2", ["--moe-grouped-gemm"]),
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
def layout_runs():
    """(reference fixture, layout) -> losses: each layout runs once per module (the grouped tests reuse the
    sequential MoE layouts)."""
    return {}


def _layout_losses(runs: dict, key: tuple, root, args, nproc: int, extra: list[str]) -> list[float]:
    if key not in runs:
        _, rows = run_pretrain(nproc, args + extra, root / key[1])
        runs[key] = [r["loss"] for r in rows]
    return runs[key]


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
def test_layout_matches_single_rank(request, layout_runs, reference_fixture, layouts, layout):
    root, args, reference = request.getfixturevalue(reference_fixture)
    nproc, extra = layouts[layout]
    losses = _layout_losses(layout_runs, (reference_fixture, layout), root, args, nproc, extra)
    _assert_same_curve(reference, losses, layout)


@pytest.mark.parametrize("layout", GROUPED_LAYOUTS)
def test_grouped_gemm_experts_match_sequential(moe_reference, layout_runs, layout):
    root, args, reference = moe_reference
    sequential_layout, extra = GROUPED_LAYOUTS[layout]
    nproc = 1
    if sequential_layout:
        nproc, layout_flags = MOE_LAYOUTS[sequential_layout]
        reference = _layout_losses(layout_runs, ("moe_reference", sequential_layout), root, args, nproc, layout_flags)
        extra = layout_flags + extra
    at = args.index("--train-iters") + 1
    args = args[:at] + [str(GROUPED_ITERS)] + args[at + 1:]
    proc, rows = run_pretrain(nproc, args + extra, root / layout)
    assert "experts GroupedMLP" in proc.stdout, proc.stdout[-2000:]
    losses = [r["loss"] for r in rows]
    assert len(losses) == GROUPED_ITERS, f"{layout}: {len(losses)} iterations logged"
    worst = max(abs(a - b) for a, b in zip(reference, losses))
    assert worst <= GROUPED_ATOL, f"{layout}: max loss difference {worst:.2e} > {GROUPED_ATOL}\n{reference}\n{losses}"
