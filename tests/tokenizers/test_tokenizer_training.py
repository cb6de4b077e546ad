"""Each ``--tokenizer-type`` kind end to end, as a Megatron-LM user runs it: its tiny files, preprocessed by
``mtmegatron preprocess`` with the same flags, train the tiny Llama-3 (``--model llama3``) for a few
iterations and the loss falls from chance over the tokenizer's own vocabulary."""

from __future__ import annotations

import math

import pytest

from helpers.pretrain_runner import TINY, run_pretrain

ITERS = 12
# TINY on real data; the vocabulary comes from the tokenizer (--vocab-size only where the kind reads it)
BASE = [a for a in TINY if a != "--mock-data"]
del BASE[BASE.index("--vocab-size"):BASE.index("--vocab-size") + 2]
BASE += ["--train-iters", str(ITERS), "--eval-iters", "0", "--num-samples", "1", "--sample-tokens", "4",
         "--log-interval", "4"]


@pytest.mark.parametrize("kind", ["SentencePieceTokenizer", "GPT2BPETokenizer", "HuggingFaceTokenizer",
                                  "TikTokenizer", "NullTokenizer"])
def test_preprocess_then_train_learns(tokenizer_set, kind, tmp_path):
    case = tokenizer_set[kind]
    # on the user's data the built-in prompts (verses of the embedded corpus) are not used: one kind says so,
    # the others continue a prompt given with --sample-prompt
    prompt = [] if kind in ("GPT2BPETokenizer", "NullTokenizer") else ["--sample-prompt", "In the beginning"]
    proc, rows = run_pretrain(1, BASE + case["flags"] + ["--data-path", case["prefix"], *prompt], tmp_path / "run")
    losses = [r["loss"] for r in rows]
    assert len(losses) == ITERS
    vocab = int(proc.stdout.split(" tokens)")[0].rsplit("(", 1)[1])  # "... | tokenizer X (N tokens)"
    assert abs(losses[0] - math.log(vocab)) < 0.5, (vocab, losses)  # starts near chance over that vocabulary
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3 - 0.3, losses
    if kind == "GPT2BPETokenizer":
        assert "no samples: the built-in prompts are verses of the embedded corpus" in proc.stdout
        assert "greedy samples" not in proc.stdout
    elif kind != "NullTokenizer":  # its text is ids: no built-in prompt to continue
        assert "greedy samples" in proc.stdout and "--- prompt: 'In the beginning'" in proc.stdout  # detokenized
