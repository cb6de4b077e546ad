"""Resuming a distributed-optimizer checkpoint across sequential <-> grouped MoE experts
(training/checkpointing._check_experts_optimizer_state): with the optimizer state loaded it is refused with one
line (exit 2: the optimizer state does not convert), while a weights-only resume (``--no-load-optim``,
``--finetune``) loads the experts' weights into the other layout and trains on. One save of a tiny Mixtral-like
model (sequential experts, one rank) serves every check.
"""

from __future__ import annotations

import pytest

from helpers.pretrain_runner import TINY, run_pretrain

MOE = TINY + ["--model", "mixtral", "--num-layers", "2", "--num-experts", "4", "--moe-router-topk", "2",
              "--moe-token-dispatcher-type", "alltoall", "--use-distributed-optimizer"]
SAVED_ITERS = 2


@pytest.fixture(scope="module")
def sequential_save(tmp_path_factory):
    root = tmp_path_factory.mktemp("grouped_resume")
    run_pretrain(1, MOE + ["--train-iters", str(SAVED_ITERS), "--save", str(root / "ckpt")], root / "save_log")
    return root


def test_optimizer_state_across_grouped_gemm_is_refused_in_one_line(sequential_save):
    root = sequential_save
    proc, rows = run_pretrain(1, MOE + ["--moe-grouped-gemm", "--train-iters", str(SAVED_ITERS + 1), "--load",
                                        str(root / "ckpt")], root / "refused", expect_ok=False)
    assert proc.returncode == 2, proc.stderr[-2000:]
    line = (f"mtmegatron.pretrain: error: checkpoint {root / 'ckpt' / f'iter_{SAVED_ITERS:07d}'} holds the "
            "distributed-optimizer state of sequential MoE experts, which does not convert to grouped ones: run "
            "without --moe-grouped-gemm, or pass --no-load-optim to load the weights only")
    assert line in proc.stderr.splitlines(), proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and not rows


@pytest.mark.parametrize("weights_only", [["--no-load-optim"], ["--finetune"]])
def test_weights_only_resume_across_grouped_gemm_trains(sequential_save, weights_only):
    root = sequential_save
    name = weights_only[0].lstrip("-")
    proc, rows = run_pretrain(1, MOE + ["--moe-grouped-gemm", "--train-iters", str(SAVED_ITERS + 1), "--load",
                                        str(root / "ckpt"), *weights_only], root / name)
    assert "experts GroupedMLP" in proc.stdout, proc.stdout[-2000:]
    # --no-load-optim keeps the saved iteration count; --finetune starts again from iteration 0
    expected = 1 if weights_only == ["--no-load-optim"] else SAVED_ITERS + 1
    assert len(rows) == expected and all(r["loss"] == r["loss"] for r in rows), rows
