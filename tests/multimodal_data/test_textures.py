"""The embedded fine-detail task (data/vision/textures.py): deterministic from its seed, train and held-out splits
disjoint, answers balanced and not in the question, pictures of several sizes that the encoders' data path keeps
whole at native resolution, and the premise of the task: the four patterns differ at native resolution and are the
same picture (within 2 of 255 levels) once shrunk to the ``--max-pixels 3136`` budget. Cost: ~5 s.
"""

from __future__ import annotations

import collections
import hashlib
import json
import os

import numpy as np
from PIL import Image

from mtmegatron.data.vision import textures
from mtmegatron.data.vision.dynamic_resolution import IMAGE_PIXELS, PatchConfig


def _read(directory, name):
    with open(os.path.join(directory, name)) as f:
        return [json.loads(line) for line in f]


def _pixels(directory, record):
    return np.asarray(Image.open(os.path.join(directory, record["image"])))


def test_deterministic_from_seed(tmp_path):
    for name, seed in (("a", 7), ("b", 7), ("c", 8)):
        textures.generate(str(tmp_path / name), seed=seed, num_train=20, num_valid=8)
    for split in ("train.jsonl", "valid.jsonl"):
        assert _read(tmp_path / "a", split) == _read(tmp_path / "b", split)
    a, b, c = ([hashlib.sha1(_pixels(tmp_path / n, r).tobytes()).hexdigest()
                for r in _read(tmp_path / n, "train.jsonl")] for n in "abc")
    assert a == b and a != c


def test_splits_disjoint_sizes_varied_answers_balanced(tmp_path):
    textures.generate(str(tmp_path), seed=3, num_train=400, num_valid=100)
    train, valid = _read(tmp_path, "train.jsonl"), _read(tmp_path, "valid.jsonl")
    hashes = {split: {hashlib.sha1(_pixels(tmp_path, r).tobytes()).hexdigest() for r in records}
              for split, records in (("train", train), ("valid", valid))}
    assert not hashes["train"] & hashes["valid"]
    sizes = collections.Counter(_pixels(tmp_path, r).shape[:2] for r in train)
    assert len(sizes) == len(textures.SIDES) ** 2  # every combination of sides
    for height, width in sizes:  # native resolution keeps them whole: no resize, 16 to 49 merged tokens
        assert IMAGE_PIXELS.resized_size(height, width) == (height, width)
    answers = collections.Counter(r["conversations"][1]["value"] for r in train)
    assert set(answers) == set(textures.PATTERNS)
    assert max(answers.values()) < 1.3 * min(answers.values()), answers
    assert {r["conversations"][0]["value"] for r in train} == {f"<image>\n{textures.QUESTION}"}
    assert textures.chance(os.path.join(tmp_path, "valid.jsonl")) == max(
        collections.Counter(r["conversations"][1]["value"] for r in valid).values()) / len(valid)


def test_the_patterns_differ_at_native_resolution_and_not_at_56x56():
    low = PatchConfig(max_pixels=56 * 56)
    for seed in range(8):
        native, shrunk = {}, {}
        for pattern in textures.PATTERNS:  # the same picture but for the pattern (same random draws)
            pixels = textures.render(pattern, np.random.default_rng(seed)).astype(np.int64)
            native[pattern] = pixels
            height, width = low.resized_size(*pixels.shape[:2])
            shrunk[pattern] = np.asarray(Image.fromarray(pixels.astype(np.uint8)).resize((width, height),
                                                                                         Image.BICUBIC)).astype(int)
        for pattern in textures.PATTERNS[:-1]:
            assert np.abs(native[pattern] - native["plain"]).max() >= 40  # the contrast: at least 40 levels
            assert np.abs(shrunk[pattern] - shrunk["plain"]).max() <= 2
        assert np.abs(native["horizontal"] - native["vertical"]).max() >= 80


def test_prepare_caches():
    directory = textures.prepare(num_train=40, num_valid=8)
    stamp = os.stat(os.path.join(directory, "train.jsonl")).st_mtime_ns
    assert textures.prepare(num_train=40, num_valid=8) == directory
    assert os.stat(os.path.join(directory, "train.jsonl")).st_mtime_ns == stamp  # not generated again
    assert len(_read(directory, "train.jsonl")) == 40 and len(_read(directory, "valid.jsonl")) == 8
