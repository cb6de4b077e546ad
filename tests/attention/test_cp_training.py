"""Context parallelism in training: per-iteration losses of CP layouts match the single-rank run.

Pattern of tests/parallel/test_equivalence.py: one initial checkpoint loaded into every layout, same global
batches, fp32, dropout 0, 8 iterations of a tiny Llama-3 (GQA, RoPE, SwiGLU) with our SDPA attention. The
reference is a single rank; the layouts split each sequence over CP ranks (load-balanced chunks) with ring
(p2p) or all-gather K/V attention, also combined with TP2+SP, PP2 and DP2 + distributed optimizer.
Tolerance: 1e-4 relative per iteration (measured 2.8e-08 to 5.8e-08). Each layout is a real ``torchrun -m mtmegatron.pretrain``.
"""

from __future__ import annotations

import pytest

from helpers.pretrain_runner import TINY, run_pretrain

ITERS = 8
RTOL = 1e-4
MODEL = TINY + ["--group-query-attention", "--seq-length", "64", "--max-position-embeddings", "64"]

LAYOUTS = {
    "cp2_p2p": (2, ["--context-parallel-size", "2", "--cp-comm-type", "p2p"]),
    "cp2_all_gather": (2, ["--context-parallel-size", "2", "--cp-comm-type", "all_gather"]),
    "cp2_tp2_sp": (4, ["--context-parallel-size", "2", "--tensor-model-parallel-size", "2",
                       "--sequence-parallel"]),
    "cp2_pp2": (4, ["--context-parallel-size", "2", "--pipeline-model-parallel-size", "2"]),
    "cp2_dp2_distopt": (4, ["--context-parallel-size", "2", "--use-distributed-optimizer"]),
}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    root = tmp_path_factory.mktemp("cp")
    run_pretrain(1, MODEL + ["--train-iters", "0", "--save", str(root / "init")], root / "init_log")
    args = MODEL + ["--train-iters", str(ITERS), "--load", str(root / "init"), "--finetune"]
    _, rows = run_pretrain(1, args, root / "single")
    losses = [r["loss"] for r in rows]
    assert len(losses) == ITERS
    assert losses[-1] < losses[0] - 0.1, f"reference run did not learn: {losses}"
    return root, args, losses


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_cp_layout_matches_single_rank(reference, layout):
    root, args, expected = reference
    nproc, extra = LAYOUTS[layout]
    _, rows = run_pretrain(nproc, args + extra, root / layout)
    losses = [r["loss"] for r in rows]
    assert len(losses) == ITERS, f"{layout}: {len(losses)} iterations logged"
    worst = max(abs(a - b) / abs(a) for a, b in zip(expected, losses))
    print(f"{layout}: max relative loss difference {worst:.2e}")
    assert worst <= RTOL, f"{layout}: max relative loss difference {worst:.2e} > {RTOL}\n{expected}\n{losses}"


def test_seq_length_not_divisible_by_two_cp_is_a_clear_error(tmp_path):
    proc, _ = run_pretrain(1, MODEL + ["--seq-length", "62", "--context-parallel-size", "2", "--train-iters", "1"],
                           tmp_path, expect_ok=False, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert ("mtmegatron.pretrain: error: --seq-length 62 is not divisible by 2 x --context-parallel-size 2 = 4"
            in proc.stderr), proc.stderr[-2000:]
