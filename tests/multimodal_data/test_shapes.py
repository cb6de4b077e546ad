"""The embedded shapes dataset: deterministic from its seed, train and held-out splits disjoint, answers balanced
within each question type and not predictable from the question text, captions matching the scene, and fast."""

from __future__ import annotations

import collections
import hashlib
import json
import os
import time

import numpy as np
from PIL import Image

from mtmegatron.data.vision import shapes


def _read(directory, name):
    with open(os.path.join(directory, name)) as f:
        return [json.loads(line) for line in f]


def _pixel_hashes(directory, records):
    return {hashlib.sha1(np.asarray(Image.open(os.path.join(directory, r["image"]))).tobytes()).hexdigest()
            for r in records}


def test_deterministic_from_seed(tmp_path):
    for name, seed in (("a", 7), ("b", 7), ("c", 8)):
        shapes.generate(str(tmp_path / name), seed=seed, num_train=40, num_valid=10)
    for split in ("train.jsonl", "valid.jsonl", "train_captions.jsonl"):
        assert _read(tmp_path / "a", split) == _read(tmp_path / "b", split)
    a, b, c = (_pixel_hashes(tmp_path / n, _read(tmp_path / n, "train.jsonl")) for n in "abc")
    assert a == b and a != c
    assert _read(tmp_path / "a", "train.jsonl") != _read(tmp_path / "c", "train.jsonl")


def test_splits_disjoint_and_answers_balanced(tmp_path):
    start = time.perf_counter()
    shapes.generate(str(tmp_path), seed=3, num_train=2000, num_valid=200)
    elapsed = time.perf_counter() - start
    assert elapsed < 20, f"generating 2200 samples took {elapsed:.1f} s"
    train, valid = _read(tmp_path, "train.jsonl"), _read(tmp_path, "valid.jsonl")
    assert not {r["id"] for r in train} & {r["id"] for r in valid}
    assert not _pixel_hashes(tmp_path, train) & _pixel_hashes(tmp_path, valid)

    by_type = collections.defaultdict(collections.Counter)
    by_question = collections.defaultdict(collections.Counter)
    for record in train:
        turns = record["conversations"]
        for question, answer in zip(turns[0::2], turns[1::2]):
            text = question["value"].replace("<image>\n", "")
            kind = ("count" if text.startswith("How many") else "colour" if text.startswith("What colour")
                    else "shape" if text.startswith("What shape") else "where")
            by_type[kind][answer["value"]] += 1
            by_question[text][answer["value"]] += 1
    expected = {"count": shapes.NUMBERS, "colour": tuple(shapes.COLOURS), "shape": shapes.SHAPES,
                "where": shapes.QUADRANTS}
    for kind, answers in expected.items():
        counts = by_type[kind]
        assert set(counts) == set(answers), kind
        mean = sum(counts.values()) / len(answers)
        assert all(abs(n - mean) < 0.25 * mean for n in counts.values()), (kind, counts)
    # the question text alone does not give the answer away
    for text, counts in by_question.items():
        if sum(counts.values()) >= 40:
            assert max(counts.values()) / sum(counts.values()) < 0.5, (text, counts)


def test_caption_and_answers_match_the_image(tmp_path):
    shapes.generate(str(tmp_path), seed=5, num_train=30, num_valid=0, height=64, width=64)
    rgb = {tuple(v): k for k, v in shapes.COLOURS.items()}
    for record in _read(tmp_path, "train_captions.jsonl"):
        pixels = np.asarray(Image.open(os.path.join(tmp_path, record["image"])))
        assert pixels.shape == (64, 64, 3)
        seen = {}
        for q, (rows, cols) in enumerate(((slice(0, 32), slice(0, 32)), (slice(0, 32), slice(32, 64)),
                                          (slice(32, 64), slice(0, 32)), (slice(32, 64), slice(32, 64)))):
            colours = {rgb[tuple(p)] for p in pixels[rows, cols].reshape(-1, 3) if tuple(p) in rgb}
            if colours:
                seen[shapes.QUADRANTS[q]] = colours.pop()
        text = record["conversations"][1]["value"]
        assert text.startswith(shapes.NUMBERS[len(seen) - 1] + " shape")
        for where, colour in seen.items():
            assert f"{colour} " in text and f"at the {where}" in text
            assert text.index(f"{colour} ") < text.index(f"at the {where}")


def test_prepare_caches_and_trains_tokenizer_with_special_tokens():
    start = time.perf_counter()
    directory, tokenizer_dir = shapes.prepare(num_train=300, num_valid=30)
    first = time.perf_counter() - start
    start = time.perf_counter()
    assert shapes.prepare(num_train=300, num_valid=30) == (directory, tokenizer_dir)
    assert time.perf_counter() - start < first
    from mtmegatron.data.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(tokenizer_dir)
    for token in ("<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<image>"):
        assert len(tokenizer.tokenize(token)) == 1, token
