"""Fixtures for the multimodal data tests: one small BPE with the chat templates' special tokens (trained once per
session) and a private cache directory. The helpers that write samples are in mm_samples.py (a plain module:
``from conftest import`` would resolve to whichever test directory's conftest was imported first)."""

from __future__ import annotations

import pytest

from mtmegatron.data.vision.template import MULTIMODAL_SPECIAL_TOKENS
from mtmegatron.data.tokenizer import train_bpe

TEXT = ["What colour is the shape? red green blue. Describe the image. A cat sits on a mat.",
        "user assistant system", "How many shapes are there? one two three four"]


@pytest.fixture(scope="session")
def tokenizer(tmp_path_factory):
    return train_bpe(TEXT * 4, 400, str(tmp_path_factory.mktemp("tok")), MULTIMODAL_SPECIAL_TOKENS)


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MTMEGATRON_CACHE", str(tmp_path / "cache"))
