"""Flags and environment for pretrain runs on real text (the embedded corpus) in tests.

The corpus is preprocessed once per pytest process into a temporary cache shared by all tests that use it
(``MTMEGATRON_CACHE`` is set for this process and inherited by the launched jobs); the first run that needs
it builds it, under the file lock every rank takes.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

from helpers.pretrain_runner import TINY

VOCAB = 1024  # the llama3 tiny preset's, so every test shares one preprocessed corpus
# TINY with real data: a 1024-token byte-level BPE of the embedded corpus instead of mock tokens.
REAL = [a for a in TINY if a != "--mock-data"]
REAL[REAL.index("--vocab-size") + 1] = str(VOCAB)
REAL += ["--num-samples", "0"]

_cache: str | None = None


def use_corpus_cache() -> str:
    """Point MTMEGATRON_CACHE (this process and its children) at one temporary cache; returns it."""
    global _cache
    if _cache is None:
        _cache = tempfile.mkdtemp(prefix="mtm-corpus-")
        atexit.register(shutil.rmtree, _cache, True)
    os.environ["MTMEGATRON_CACHE"] = _cache
    return _cache
