"""The corpus shipped in the package (``corpus/kjv.jsonl.xz``, see ``corpus/NOTICE.md``) and its preprocessed
form, made on first use: a byte-level BPE of the model's vocabulary size trained on it, and the indexed
dataset, both in a cache directory (``$MTMEGATRON_CACHE``, default ``~/.cache/mtmegatron``).

Every rank may call ``prepare`` at once: the first takes an exclusive file lock and builds, the others wait
on the lock and then find the ``complete`` marker (written last, after the atomic renames).
May assume: a POSIX file system (fcntl locks).
"""

from __future__ import annotations

import fcntl
import os
from importlib import resources

from mtmegatron.data.preprocess import iter_documents, preprocess
from mtmegatron.data.tokenizer import train_bpe

CORPUS_NAME = "kjv"
CORPUS_VERSION = 1  # bump when the shipped corpus or the preprocessing changes


def corpus_path() -> str:
    return str(resources.files("mtmegatron.data") / "corpus" / f"{CORPUS_NAME}.jsonl.xz")


def cache_root() -> str:
    return os.environ.get("MTMEGATRON_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "mtmegatron")


def prepare(vocab_size: int, progress: bool = True) -> tuple[str, str]:
    """Returns (dataset prefix, tokenizer directory) of the embedded corpus for this vocabulary size."""
    directory = os.path.join(cache_root(), f"{CORPUS_NAME}-v{CORPUS_VERSION}-bpe{vocab_size}")
    prefix = os.path.join(directory, CORPUS_NAME)
    tokenizer_dir = os.path.join(directory, "tokenizer")
    marker = os.path.join(directory, "complete")
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if not os.path.exists(marker):
                source = corpus_path()
                tokenizer = train_bpe(iter_documents([source], "text"), vocab_size, tokenizer_dir)
                prefix = preprocess([source], prefix, tokenizer, "text", workers=1, progress=progress)
                with open(marker + ".tmp", "w") as f:
                    f.write(f"{prefix}\n")
                os.replace(marker + ".tmp", marker)
            with open(marker) as f:
                prefix = f.read().strip()
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return prefix, tokenizer_dir
