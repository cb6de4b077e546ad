"""The embedded multimodal dataset: procedurally rendered coloured shapes with questions whose answers can only
be read from the image. No network, no shipped files: generated on first use into the cache directory as
LLaVA JSONL + PNG files, so the same loader that reads users' data reads it.

A scene is a 2x2 grid of quadrants; 1-4 of them hold a shape (circle, square or triangle) in one of four
colours, every (colour, shape) pair at most once per scene, with jittered size and position on a noisy dark
background. Each sample asks ``questions_per_image`` different questions about its scene:
- "How many shapes are there?" -> one .. four
- "What colour is the shape at the top left?" -> red / green / blue / yellow
- "What shape is at the bottom right?" -> circle / square / triangle
- "Where is the red circle?" -> top left / top right / bottom left / bottom right
Scene parameters are drawn uniformly, so within each question type every answer is equally likely and the
question text alone does not predict it (only an image does). ``*_captions.jsonl`` holds one caption per image
("two shapes: a red circle at the top left and a blue square at the bottom right.") for ``--prompt-format plain``.
Train and held-out (``valid``) splits come from different random streams of the same seed; a held-out image
identical to a training image is redrawn. A byte-level BPE trained on the text (with the chat templates'
special tokens as single tokens) is saved beside the data.
May assume: numpy and Pillow; a POSIX file system (the cache's file lock: ``generated_cache.py``).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import numpy as np
from PIL import Image

from mtmegatron.data.vision.generated_cache import draw_unseen, generate_once, locked
from mtmegatron.data.vision.template import MULTIMODAL_SPECIAL_TOKENS, VICUNA_SYSTEM

SHAPES_VERSION = 1  # bump when the generated data changes
COLOURS = {"red": (220, 45, 45), "green": (40, 200, 70), "blue": (50, 100, 235), "yellow": (235, 215, 40)}
SHAPES = ("circle", "square", "triangle")
QUADRANTS = ("top left", "top right", "bottom left", "bottom right")
NUMBERS = ("one", "two", "three", "four")
QUESTION_TYPES = ("count", "colour", "shape", "where")
SPLITS = ("train", "valid")


@dataclass(frozen=True)
class Item:
    quadrant: int  # index into QUADRANTS
    colour: str
    shape: str


def draw_scene(rng: np.random.Generator) -> list[Item]:
    count = int(rng.integers(1, 5))
    quadrants = sorted(rng.choice(4, size=count, replace=False).tolist())
    pairs = rng.choice(len(COLOURS) * len(SHAPES), size=count, replace=False)
    colours = list(COLOURS)
    return [Item(q, colours[p // len(SHAPES)], SHAPES[p % len(SHAPES)]) for q, p in zip(quadrants, pairs)]


def render_scene(items: list[Item], height: int, width: int, rng: np.random.Generator) -> np.ndarray:
    """uint8 [height, width, 3]."""
    pixels = rng.integers(10, 40, size=(height, width, 3)).astype(np.uint8)
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    qh, qw = height / 2, width / 2
    for item in items:
        row, col = divmod(item.quadrant, 2)
        radius = min(qh, qw) * rng.uniform(0.28, 0.38)
        cy = (row + 0.5) * qh + rng.uniform(-0.08, 0.08) * qh
        cx = (col + 0.5) * qw + rng.uniform(-0.08, 0.08) * qw
        dy, dx = yy - cy, xx - cx
        if item.shape == "circle":
            mask = dy * dy + dx * dx <= radius * radius
        elif item.shape == "square":
            mask = (np.abs(dy) <= 0.85 * radius) & (np.abs(dx) <= 0.85 * radius)
        else:  # triangle pointing up: apex at cy - radius, base at cy + 0.8 radius
            mask = (dy >= -radius) & (dy <= 0.8 * radius) & (np.abs(dx) <= 0.6 * (dy + radius))
        pixels[mask] = COLOURS[item.colour]
    return pixels


def ask(kind: str, items: list[Item], rng: np.random.Generator) -> tuple[str, str]:
    """(question, answer) of type ``kind`` about the scene."""
    if kind == "count":
        return "How many shapes are there?", NUMBERS[len(items) - 1]
    item = items[int(rng.integers(len(items)))]
    where = QUADRANTS[item.quadrant]
    if kind == "colour":
        return f"What colour is the shape at the {where}?", item.colour
    if kind == "shape":
        return f"What shape is at the {where}?", item.shape
    return f"Where is the {item.colour} {item.shape}?", where


def caption(items: list[Item]) -> str:
    noun = "shape" if len(items) == 1 else "shapes"
    parts = [f"a {i.colour} {i.shape} at the {QUADRANTS[i.quadrant]}" for i in items]
    listed = parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]
    return f"{NUMBERS[len(items) - 1]} {noun}: {listed}."


def _scene(rng, height: int, width: int):
    items = draw_scene(rng)
    return items, render_scene(items, height, width, rng)


def generate(out_dir: str, seed: int = 1234, num_train: int = 4000, num_valid: int = 256, height: int = 32,
             width: int = 32, questions_per_image: int = 2) -> dict[str, int]:
    """Write ``{split}.jsonl``, ``{split}_captions.jsonl`` and ``images/{split}/*.png`` under ``out_dir``."""
    counts = {}
    train_hashes: set[bytes] = set()
    for split_number, (split, num) in enumerate(zip(SPLITS, (num_train, num_valid))):
        rng = np.random.default_rng([seed, split_number])
        os.makedirs(os.path.join(out_dir, "images", split), exist_ok=True)
        with open(os.path.join(out_dir, f"{split}.jsonl"), "w") as qa, \
                open(os.path.join(out_dir, f"{split}_captions.jsonl"), "w") as captions:
            for index in range(num):
                items, pixels = draw_unseen(lambda: _scene(rng, height, width), lambda drawn: drawn[1], split,
                                            train_hashes)
                image = f"images/{split}/{index:06d}.png"
                Image.fromarray(pixels).save(os.path.join(out_dir, image), compress_level=1)
                kinds = rng.choice(len(QUESTION_TYPES), size=questions_per_image, replace=False)
                conversation = []
                for k, kind in enumerate(kinds):
                    question, answer = ask(QUESTION_TYPES[kind], items, rng)
                    conversation += [{"from": "human", "value": ("<image>\n" if k == 0 else "") + question},
                                     {"from": "gpt", "value": answer}]
                sample_id = f"shapes-{split}-{index:06d}"
                qa.write(json.dumps({"id": sample_id, "image": image, "conversations": conversation}) + "\n")
                captions.write(json.dumps({"id": sample_id, "image": image, "conversations": [
                    {"from": "human", "value": "<image>\nDescribe the image."},
                    {"from": "gpt", "value": caption(items)}]}) + "\n")
        counts[split] = num
    return counts


def corpus_texts(out_dir: str):
    """Every string a template can produce from the generated files (for training the tokenizer)."""
    yield from ("user", "assistant", "system", "USER:", "ASSISTANT:", VICUNA_SYSTEM, "\n\n")
    for split in SPLITS:
        for name in (f"{split}.jsonl", f"{split}_captions.jsonl"):
            with open(os.path.join(out_dir, name)) as f:
                for line in f:
                    for turn in json.loads(line)["conversations"]:
                        yield turn["value"].replace("<image>\n", "")


def prepare(seed: int = 1234, num_train: int = 4000, num_valid: int = 256, height: int = 32, width: int = 32,
            vocab_size: int = 1024, questions_per_image: int = 2) -> tuple[str, str]:
    """(data directory, tokenizer directory) of the shapes dataset with these parameters, generated once into
    ``$MTMEGATRON_CACHE/shapes-v*/...`` under a file lock (every rank may call it at once)."""
    from mtmegatron.data.embedded import cache_root
    from mtmegatron.data.tokenizer import train_bpe

    name = f"shapes-v{SHAPES_VERSION}-s{seed}-n{num_train}-{num_valid}-{height}x{width}-q{questions_per_image}"
    directory = os.path.join(cache_root(), name)
    tokenizer_dir = os.path.join(directory, f"tokenizer-bpe{vocab_size}")
    with locked(directory):
        generate_once(directory, lambda d: generate(d, seed, num_train, num_valid, height, width, questions_per_image))
        if not os.path.exists(os.path.join(tokenizer_dir, "tokenizer.json")):
            train_bpe(corpus_texts(directory), vocab_size, tokenizer_dir, MULTIMODAL_SPECIAL_TOKENS)
    return directory, tokenizer_dir
