"""The embedded SFT task: tiny arithmetic questions, generated deterministically, with a held-out split.

"What is 3+5?" -> "8", for every pair of one-digit numbers ``a + b`` and one more kind, "What comes after 47?"
-> "48" for 0..999: the successor rule (copy the digits, increment the last, carry) generalises to numbers
never seen in training, which is what the held-out accuracy measures. Which questions are held out is fixed
by a seeded permutation (``HELD_OUT`` of them), never by the run's seed. Written as Megatron-LM SFT JSONL
(``{"messages": [...]}``) into the cache with a byte-level BPE trained on the task's own text (the chat
template's special tokens kept whole), so a run needs no files.
May assume: a writable cache directory (``$MTMEGATRON_CACHE``); every rank may call ``prepare`` at once.
"""

from __future__ import annotations

import fcntl
import json
import os

import numpy as np

from mtmegatron.data.embedded import cache_root
from mtmegatron.data.tokenizer import train_bpe

TASK_VERSION = 1
HELD_OUT = 100
TASK_SEED = 20  # fixes the split, whatever --seed the run uses
BPE_MERGES = 40  # few merges: digits stay single tokens, the fixed words become a few tokens


def questions() -> list[tuple[str, str]]:
    pairs = [(f"What is {a}+{b}?", str(a + b)) for a in range(10) for b in range(10)]
    pairs += [(f"What comes after {n}?", str(n + 1)) for n in range(1000)]
    return pairs


def split() -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(train, held-out) question/answer pairs; held-out ones come from the successor kind only."""
    pairs = questions()
    successor = np.arange(100, len(pairs))
    held = set(np.random.RandomState(TASK_SEED).permutation(successor)[:HELD_OUT].tolist())
    return ([p for i, p in enumerate(pairs) if i not in held], [p for i, p in enumerate(pairs) if i in held])


def conversation(question: str, answer: str | None = None) -> list[dict]:
    messages = [{"role": "user", "content": question}]
    return messages + [{"role": "assistant", "content": answer}] if answer is not None else messages


def prepare(special_tokens: tuple[str, ...]) -> tuple[str, str, str]:
    """(train JSONL, held-out JSONL, tokenizer directory), written once into the cache."""
    name = f"sft-arithmetic-v{TASK_VERSION}-{'-'.join(t.strip('<>|') for t in special_tokens) or 'plain'}"
    directory = os.path.join(cache_root(), name)
    files = os.path.join(directory, "train.jsonl"), os.path.join(directory, "held_out.jsonl")
    tokenizer_dir = os.path.join(directory, "tokenizer")
    marker = os.path.join(directory, "complete")
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if not os.path.exists(marker):
                train, held_out = split()
                for path, pairs in zip(files, (train, held_out)):
                    with open(path + ".tmp", "w") as f:
                        for q, a in pairs:
                            f.write(json.dumps({"messages": conversation(q, a)}) + "\n")
                    os.replace(path + ".tmp", path)
                texts = [f"User: {q}\nAssistant:\n{a}\n" for q, a in train]
                train_bpe(texts, 258 + len(special_tokens) + BPE_MERGES, tokenizer_dir, special_tokens)
                with open(marker, "w") as f:
                    f.write("ok\n")
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return files[0], files[1], tokenizer_dir
