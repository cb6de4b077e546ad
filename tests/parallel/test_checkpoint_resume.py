"""Save/load through dist_checkpointing: a run resumed from a mid-run checkpoint (model, optimizer, LR
schedule, RNG) reproduces the uninterrupted run's losses exactly; an incomplete save is never "latest"."""

from __future__ import annotations

from helpers.pretrain_runner import TINY, run_pretrain

TP2 = ["--tensor-model-parallel-size", "2", "--sequence-parallel", "--use-distributed-optimizer",
       "--lr-decay-style", "cosine", "--lr-warmup-iters", "2", "--hidden-dropout", "0.1"]


def test_resume_reproduces_uninterrupted_run(tmp_path):
    args = TINY + TP2
    args = args + ["--train-iters", "6"]
    _, full = run_pretrain(2, args, tmp_path / "full")
    saving, _ = run_pretrain(2, args + ["--exit-interval", "3", "--save", str(tmp_path / "ckpt")], tmp_path / "first")
    # the common state (Megatron-LM's args among it) is rank 0's alone on disk: every rank must hold the same
    assert "common state dict differs" not in saving.stdout + saving.stderr
    assert (tmp_path / "ckpt" / "latest_checkpointed_iteration.txt").read_text() == "3"
    assert not list((tmp_path / "ckpt").glob("*.partial"))
    # the resumed run continues the 6-iteration schedule from iteration 4
    _, resumed = run_pretrain(2, args + ["--load", str(tmp_path / "ckpt")], tmp_path / "second")
    assert [r["iteration"] for r in resumed] == [4, 5, 6]
    assert [r["loss"] for r in resumed] == [r["loss"] for r in full[3:]]
    assert [r["lr"] for r in resumed] == [r["lr"] for r in full[3:]]

