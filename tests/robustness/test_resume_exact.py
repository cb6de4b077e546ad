"""Exact resume on real data: 20 iterations uninterrupted, saved at 10, resumed from 10 to 20 — the same layout
reproduces iterations 11-20 bit for bit (losses, validation losses, learning rates); resuming the same
checkpoint under another layout (TP2 -> PP2) matches within 1e-4 relative (fp32; only reduction order
differs, as in tests/parallel/test_equivalence.py)."""

from __future__ import annotations

import pytest

from helpers.pretrain_runner import TINY, run_pretrain
from helpers.real_data import REAL, use_corpus_cache

RTOL = 1e-4
# with DataLoader workers (Megatron-LM's default 2; the shared TINY reads in-process): the data position resumes
# through the workers' readers too
BASE = REAL + ["--train-iters", "20", "--eval-interval", "5", "--eval-iters", "1", "--lr-decay-style", "cosine",
               "--lr-warmup-iters", "3", "--num-workers", "2"]
TP2 = ["--tensor-model-parallel-size", "2", "--sequence-parallel", "--use-distributed-optimizer"]
PP2 = ["--pipeline-model-parallel-size", "2", "--use-distributed-optimizer"]


def test_resume_at_10_reproduces_20_uninterrupted_iterations(tmp_path):
    use_corpus_cache()
    ckpt = str(tmp_path / "ckpt")
    # the uninterrupted run saves at 10 (and at 20, its end); the tracker is pointed back at 10
    _, full = run_pretrain(2, BASE + TP2 + ["--save", ckpt, "--save-interval", "10"], tmp_path / "full")
    (tmp_path / "ckpt" / "latest_checkpointed_iteration.txt").write_text("10")
    _, same = run_pretrain(2, BASE + TP2 + ["--load", ckpt], tmp_path / "same")
    assert [r["iteration"] for r in same] == list(range(11, 21))
    for key in ("loss", "lr", "grad_norm", "skipped_steps"):
        assert [r[key] for r in same] == [r[key] for r in full[10:]], key
    assert [r.get("val_loss") for r in same] == [r.get("val_loss") for r in full[10:]]
    assert sum("val_loss" in r for r in same) == 2  # iterations 15 and 20

    _, other = run_pretrain(2, BASE + PP2 + ["--load", ckpt], tmp_path / "other")
    assert [r["iteration"] for r in other] == list(range(11, 21))
    pairs = [(a["loss"], b["loss"]) for a, b in zip(full[10:], other)]
    pairs += [(a["val_loss"], b["val_loss"]) for a, b in zip(full[10:], other) if "val_loss" in a]
    worst = max(abs(a - b) / abs(a) for a, b in pairs)
    print(f"TP2 -> PP2 resume: max relative loss difference {worst:.2e}")
    assert worst <= RTOL, pairs



# Megatron-LM's default dropout (0.1 hidden, 0.1 attention) with evaluations inside the resumed span: the random
# streams dropout draws from (the host generator, which is the device generator on the cpu backend, and megatron-
# core's model-parallel tracker states) are restored from the checkpoint, and neither building the data iterator
# after the load nor an evaluation's iterator draws from them (training/data.py gives each DataLoader its own
# generator: iter() draws its workers' base seed from it). One uninterrupted run of 7 iterations (evaluations at 5
# and 7) saves at 4; the run loaded from that checkpoint evaluates after every iteration and must reproduce
# iterations 5-7 bit for bit. Without the DataLoader's own generator both layouts differed from iteration 5 on (the
# iterator built after the load drew from the restored stream), and an evaluation changed later training losses.
DROPOUT = [a for a in TINY]
DROPOUT[DROPOUT.index("--hidden-dropout") + 1] = "0.1"
DROPOUT[DROPOUT.index("--attention-dropout") + 1] = "0.1"
DROPOUT += ["--train-iters", "7", "--eval-iters", "1", "--num-workers", "0"]
LAYOUTS = {
    "dp2_distopt": (2, ["--use-distributed-optimizer"]),
    # the tracker's model-parallel stream (attention dropout under TP without SP) and PP's per-stage seeds
    "tp2_pp2": (4, ["--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2"]),
}


@pytest.fixture(scope="module")
def dropout_runs(tmp_path_factory):
    """Layout -> (uninterrupted rows, rows resumed from iteration 4), each layout run when first asked for."""
    runs = {}

    def get(layout: str):
        if layout not in runs:
            nproc, extra = LAYOUTS[layout]
            directory = tmp_path_factory.mktemp(layout)
            ckpt = directory / "ckpt"
            _, full = run_pretrain(nproc, DROPOUT + extra + ["--eval-interval", "5", "--save", str(ckpt),
                                                             "--save-interval", "4"], directory / "full")
            (ckpt / "latest_checkpointed_iteration.txt").write_text("4")  # resume at 4 (7 was saved at the end)
            _, resumed = run_pretrain(nproc, DROPOUT + extra + ["--eval-interval", "1", "--load", str(ckpt)],
                                      directory / "resumed")
            runs[layout] = (full, resumed)
        return runs[layout]
    return get


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_resume_with_dropout_and_evaluation_is_exact(layout, dropout_runs):
    full, resumed = dropout_runs(layout)
    assert [r["iteration"] for r in resumed] == [5, 6, 7]
    assert ["val_loss" in r for r in full[4:]] == [True, False, True]
    for key in ("loss", "grad_norm", "lr"):
        assert [r[key] for r in resumed] == [r[key] for r in full[4:]], key
    assert [resumed[0]["val_loss"], resumed[2]["val_loss"]] == [full[4]["val_loss"], full[6]["val_loss"]]


def test_evaluation_leaves_training_losses_unchanged(dropout_runs):
    """The resumed run evaluated after iteration 6 too, the uninterrupted one did not: iteration 7 trained the same."""
    full, resumed = dropout_runs("dp2_distopt")
    assert "val_loss" in resumed[1] and "val_loss" not in full[5]
    assert (resumed[2]["loss"], resumed[2]["grad_norm"]) == (full[6]["loss"], full[6]["grad_norm"])
