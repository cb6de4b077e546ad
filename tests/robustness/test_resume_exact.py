"""Exact resume on real data: 20 iterations uninterrupted vs 10, stop, resume to 20 — the same layout
reproduces iterations 11-20 bit for bit (losses, validation losses, learning rates); resuming the same
checkpoint under another layout (TP2 -> PP2) matches within 1e-4 relative (fp32; only reduction order
differs, as in tests/parallel/test_equivalence.py)."""

from __future__ import annotations

from helpers.pretrain_runner import run_pretrain
from helpers.real_data import REAL, use_corpus_cache

RTOL = 1e-4
BASE = REAL + ["--train-iters", "20", "--eval-interval", "5", "--eval-iters", "1", "--lr-decay-style", "cosine",
               "--lr-warmup-iters", "3"]
TP2 = ["--tensor-model-parallel-size", "2", "--sequence-parallel", "--use-distributed-optimizer"]
PP2 = ["--pipeline-model-parallel-size", "2", "--use-distributed-optimizer"]


def test_resume_at_10_reproduces_20_uninterrupted_iterations(tmp_path):
    use_corpus_cache()
    ckpt = str(tmp_path / "ckpt")
    _, full = run_pretrain(2, BASE + TP2, tmp_path / "full")
    _, first = run_pretrain(2, BASE + TP2 + ["--exit-interval", "10", "--save", ckpt, "--keep-last", "1"], tmp_path / "first")
    assert first == [dict(r, tokens_per_sec=f["tokens_per_sec"], step_time_ms=f["step_time_ms"])
                     for r, f in zip(full[:10], first)]
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
