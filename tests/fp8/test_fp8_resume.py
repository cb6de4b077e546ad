"""FP8 state in checkpoints: a delayed-scaling run (amax history of 4, ``max``) under TP2 + SP resumed from a
mid-run checkpoint reproduces the uninterrupted run's losses exactly; if the histories and scales were not
restored the first resumed steps would cast with scale 1 and the losses would differ."""

from __future__ import annotations

from helpers.pretrain_runner import TINY, run_pretrain

ARGS = TINY + ["--num-layers", "2", "--global-batch-size", "4", "--bf16", "--tensor-model-parallel-size", "2",
               "--sequence-parallel", "--fp8-format", "hybrid", "--fp8-recipe", "delayed",
               "--fp8-amax-history-len", "4", "--fp8-amax-compute-algo", "max", "--train-iters", "6"]


def test_delayed_scaling_resume_reproduces_losses(tmp_path):
    ckpt = tmp_path / "ckpt"
    _, full = run_pretrain(2, ARGS + ["--save", str(ckpt), "--save-interval", "3"], tmp_path / "full")
    (ckpt / "latest_checkpointed_iteration.txt").write_text("3")  # resume from the mid-run checkpoint
    _, resumed = run_pretrain(2, ARGS + ["--load", str(tmp_path / "ckpt")], tmp_path / "second")
    assert [r["iteration"] for r in resumed] == [4, 5, 6]
    assert [r["loss"] for r in resumed] == [r["loss"] for r in full[3:]]
