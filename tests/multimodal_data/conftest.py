"""Fixtures for the multimodal data tests: one small BPE with the chat templates' special tokens (trained once per
session), a private cache directory, and helpers to write JSONL samples and PNG images."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from PIL import Image

from mtmegatron.data.multimodal.template import MULTIMODAL_SPECIAL_TOKENS
from mtmegatron.data.tokenizer import train_bpe

TEXT = ["What colour is the shape? red green blue. Describe the image. A cat sits on a mat.",
        "user assistant system", "How many shapes are there? one two three four"]


@pytest.fixture(scope="session")
def tokenizer(tmp_path_factory):
    return train_bpe(TEXT * 4, 400, str(tmp_path_factory.mktemp("tok")), MULTIMODAL_SPECIAL_TOKENS)


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MTMEGATRON_CACHE", str(tmp_path / "cache"))


def write_png(path, width: int, height: int, colour=(200, 30, 30)) -> str:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    Image.fromarray(np.full((height, width, 3), colour, dtype=np.uint8)).save(path)
    return path


def write_jsonl(path, records) -> str:
    with open(path, "w") as f:
        for record in records:
            f.write(record if isinstance(record, str) else json.dumps(record))
            f.write("\n")
    return str(path)


def qa(image=None, question="<image>\nWhat colour is the shape?", answer="red", sample_id="s"):
    record = {"id": sample_id, "conversations": [{"from": "human", "value": question},
                                                 {"from": "gpt", "value": answer}]}
    if image is not None:
        record["image"] = image
    return record
