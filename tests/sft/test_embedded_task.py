"""The acceptance run of ``--sft``: the embedded arithmetic task, fine-tuned from scratch on the tiny Llama
through ``mtmegatron.pretrain`` as users launch it, learns: the loss falls and held-out exact match rises
from 0 to at least ``THRESHOLD`` (measured: 0% -> 70-80% at 400 iterations, seed 1234); ``samples.txt`` holds
chat-formatted answers. (Bad ``--data-path`` records: tests/test_bad_inputs.py.)
"""

from __future__ import annotations

import json

from helpers.pretrain_runner import TINY, run_pretrain

THRESHOLD = 0.5
ITERS = 400


def _argv(extra: list[str]) -> list[str]:
    argv = [a for a in TINY if a != "--mock-data"]
    for flag, value in (("--vocab-size", "320"), ("--seq-length", "64"), ("--max-position-embeddings", "64"),
                        ("--num-layers", "2")):
        argv[argv.index(flag) + 1] = value
    return argv + ["--sft", "--sft-tokenizer-prompt-format", "plain", *extra]


def test_held_out_accuracy_rises(tmp_path):
    proc, rows = run_pretrain(1, _argv(["--train-iters", str(ITERS), "--log-interval", "50"]), tmp_path / "log",
                              env={"MTMEGATRON_CACHE": str(tmp_path / "cache")}, timeout=600)
    result = json.loads((tmp_path / "log" / "sft_eval.json").read_text())
    assert result["held_out"] == 100
    assert result["exact_match_before"] == 0.0
    assert result["exact_match_after"] >= THRESHOLD, result
    assert rows[-1]["loss"] < rows[0]["loss"] / 4
    samples = (tmp_path / "log" / "samples.txt").read_text()
    assert "User: What comes after" in samples and "Assistant:\n" in samples
    assert "held-out exact match after training" in proc.stdout

