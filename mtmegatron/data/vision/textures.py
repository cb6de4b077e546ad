"""The embedded fine-detail image task: pictures of varying sizes whose answer is in detail a low resolution loses,
for showing what native (dynamic) resolution buys a vision-language model. No network, no shipped files: generated
on first use into the cache directory (``generated_cache.py``) as conversation JSONL + PNG files, so the loader that
reads users' data reads it (``--train-data-path <dir>/train.jsonl --valid-data-path <dir>/valid.jsonl``).

A picture (each side one of ``SIDES``, multiples of the encoders' 28-pixel merge window, so at native resolution
nothing is resized) is a plain background with a box of half to four fifths of each side at a random place. The box
is filled with one of four ``PATTERNS`` in two shades ``base +- contrast`` of a random colour: horizontal stripes,
vertical stripes (one pixel wide, alternating), a one-pixel checkerboard, or the plain ``base`` colour. The light
rows/columns are the picture's even ones wherever the box is (so every 14x14 patch inside the box shows the pattern
in the same phase), and the contrast fades in over the box's outer ``FADE_PIXELS`` (so no stripe edge survives a
shrink as a brighter border). The four fills have the same mean colour: once a picture is shrunk by two or more
(``--max-pixels 3136``: at most 56x56 pixels) the box looks the same whatever its pattern (within 2 of 255 levels).
Each record asks "What pattern fills the box?" with the pattern's name as the answer; the patterns are drawn
uniformly, so the text alone predicts no better than chance (the most frequent held-out answer's share, ``chance``).
Train and held-out (``valid``) splits come from different random streams of the same seed; a held-out picture
identical to a training one is redrawn.
May assume: numpy and Pillow.
"""

from __future__ import annotations

import collections
import json
import os

import numpy as np
from PIL import Image

from mtmegatron.data.vision.generated_cache import draw_unseen, generate_once, locked

TEXTURES_VERSION = 1  # bump when the generated data changes
SIDES = (112, 140, 168, 196)  # pixels; 16 to 49 merged image tokens per picture at native resolution
PATTERNS = ("horizontal", "vertical", "checked", "plain")
FADE_PIXELS = 4
QUESTION = "What pattern fills the box?"
SPLITS = ("train", "valid")


def render(pattern: str, rng: np.random.Generator) -> np.ndarray:
    """uint8 [height, width, 3]: a box filled with ``pattern`` on a plain background (module docstring)."""
    height, width = (int(s) for s in rng.choice(SIDES, size=2))
    base = rng.integers(80, 176, size=3)
    contrast = int(rng.integers(40, 71))
    while True:  # a background that differs from the box's mean colour
        background = rng.integers(20, 236, size=3)
        if np.abs(background - base).max() >= 50:
            break
    pixels = np.empty((height, width, 3), np.uint8)
    pixels[:] = background
    box_h = int(rng.integers(height // 2, height * 4 // 5 + 1))
    box_w = int(rng.integers(width // 2, width * 4 // 5 + 1))
    top, left = int(rng.integers(0, height - box_h + 1)), int(rng.integers(0, width - box_w + 1))
    yy, xx = np.mgrid[top:top + box_h, left:left + box_w]  # the phase is the picture's: even rows/columns light
    if pattern == "horizontal":
        sign = np.where(yy % 2 == 0, 1, -1)
    elif pattern == "vertical":
        sign = np.where(xx % 2 == 0, 1, -1)
    elif pattern == "checked":
        sign = np.where((yy + xx) % 2 == 0, 1, -1)
    else:
        sign = np.zeros_like(yy)
    yy, xx = yy - top, xx - left
    edge = np.minimum(np.minimum(yy, box_h - 1 - yy), np.minimum(xx, box_w - 1 - xx))
    fade = np.clip((edge + 1) / (FADE_PIXELS + 1), 0, 1)
    fill = base + contrast * (sign * fade)[..., None]
    pixels[top:top + box_h, left:left + box_w] = np.rint(fill).astype(np.uint8)
    return pixels


def generate(out_dir: str, seed: int = 1234, num_train: int = 2048, num_valid: int = 256) -> dict[str, int]:
    """Write ``{split}.jsonl`` and ``images/{split}/*.png`` under ``out_dir``."""
    counts = {}
    train_hashes: set[bytes] = set()
    for split_number, (split, num) in enumerate(zip(SPLITS, (num_train, num_valid))):
        rng = np.random.default_rng([seed, split_number])
        os.makedirs(os.path.join(out_dir, "images", split), exist_ok=True)
        with open(os.path.join(out_dir, f"{split}.jsonl"), "w") as out:
            for index in range(num):
                pattern = PATTERNS[int(rng.integers(len(PATTERNS)))]
                pixels = draw_unseen(lambda: render(pattern, rng), lambda drawn: drawn, split, train_hashes)
                image = f"images/{split}/{index:06d}.png"
                Image.fromarray(pixels).save(os.path.join(out_dir, image), compress_level=1)
                out.write(json.dumps({"id": f"textures-{split}-{index:06d}", "image": image, "conversations": [
                    {"from": "human", "value": f"<image>\n{QUESTION}"}, {"from": "gpt", "value": pattern}]}) + "\n")
        counts[split] = num
    return counts


def chance(path: str) -> float:
    """The most frequent answer's share of the records in ``path``: the best held-out accuracy without images."""
    with open(path) as f:
        answers = collections.Counter(json.loads(line)["conversations"][1]["value"] for line in f)
    return max(answers.values()) / sum(answers.values())


def prepare(seed: int = 1234, num_train: int = 2048, num_valid: int = 256) -> str:
    """The directory of the textures set with these parameters (``train.jsonl``, ``valid.jsonl``, ``images/``),
    generated once into ``$MTMEGATRON_CACHE/textures-v*/...``."""
    from mtmegatron.data.embedded import cache_root

    directory = os.path.join(cache_root(), f"textures-v{TEXTURES_VERSION}-s{seed}-n{num_train}-{num_valid}")
    with locked(directory):
        generate_once(directory, lambda d: generate(d, seed, num_train, num_valid))
    return directory
