"""What native (dynamic) resolution costs against padding every image to the largest one, one run, one table.

The same conversations (generated here: pictures whose sides range from ``--min-side`` to ``--max-side`` pixels, a
short question and answer each) train the same Qwen2.5-VL (or ``--model qwen2-vl``) twice, one process each:
* native: each image becomes the vision tokens its own size needs (``--balance-micro-batches`` off: the
  contiguous slices, as Megatron-LM reads);
* padded to the largest: ``--min-pixels`` set to the largest picture's area, so HF's resize scales every smaller
  picture up to that area — the cost of a fixed-size encoder input that fits the largest image.
Rows: the median step time after ``--warmup`` steps and the vision tokens (after the 2x2 merge) of a step, computed from the pictures with the data path's own resize (data/vision/dynamic_resolution.py),
and vision tokens/s; the text of each conversation is the same in both runs. The ratio column is each row's step
time over the native row's.
The language model's sequence is padded to ``--seq-length`` in both (the pipeline's fixed shape), so the
difference is the vision tower's work plus the image tokens it feeds.
Usage: python benchmarks/vision.py [--backend cpu] [--model qwen2.5-vl] [--model-size tiny] [--iters 8]
       [--warmup 3] [--samples 64] [--min-side 56] [--max-side 336] [--micro-batch-size 4] [--json F]
Exit status 1 when a run failed.
May assume: mtmegatron installed; one rank (no launcher variables needed).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile

import numpy as np
from PIL import Image

from mtmegatron.data.vision.dynamic_resolution import IMAGE_PIXELS

QUESTION = "<image>\nIs the bright square on the left or the right?"


def write_pictures(root: str, samples: int, min_side: int, max_side: int, seed: int = 0) -> list[tuple[int, int]]:
    """``samples`` pictures of random sides in [min_side, max_side] (multiples of 28) and their JSONL; the sizes."""
    os.makedirs(os.path.join(root, "images"), exist_ok=True)
    rng = np.random.default_rng(seed)
    sides = np.arange(min_side // 28, max_side // 28 + 1) * 28
    sizes, records = [], []
    for i in range(samples):
        width, height = (int(s) for s in rng.choice(sides, 2))
        pixels = rng.integers(0, 60, (height, width, 3), dtype=np.uint8)
        left = bool(rng.integers(2))
        x0 = 0 if left else width // 2
        pixels[height // 4: height // 2, x0 + width // 8: x0 + width // 4 + width // 8] = 230
        Image.fromarray(pixels).save(os.path.join(root, "images", f"p{i}.png"))
        records.append({"id": f"p{i}", "image": f"p{i}.png", "conversations": [
            {"from": "human", "value": QUESTION}, {"from": "gpt", "value": "left" if left else "right"}]})
        sizes.append((height, width))
    with open(os.path.join(root, "data.jsonl"), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)
    return sizes


def vision_tokens(sizes, min_pixels: int | None) -> list[int]:
    """Merged vision tokens of each picture under the data path's resize (HF's smart_resize)."""
    config = IMAGE_PIXELS if min_pixels is None else dataclasses.replace(IMAGE_PIXELS, min_pixels=min_pixels)
    return [config.num_tokens(config.grid(h, w)) for h, w in sizes]


def run(flags: list[str], log_dir: str) -> list[dict]:
    proc = subprocess.run([sys.executable, "-m", "mtmegatron.pretrain", *flags, "--log-dir", log_dir],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"pretrain failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    with open(os.path.join(log_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", default="cpu")
    p.add_argument("--model", default="qwen2.5-vl", choices=["qwen2-vl", "qwen2.5-vl"])
    p.add_argument("--model-size", default="tiny")
    p.add_argument("--iters", type=int, default=8)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--samples", type=int, default=64)
    p.add_argument("--min-side", type=int, default=56)
    p.add_argument("--max-side", type=int, default=336)
    p.add_argument("--micro-batch-size", type=int, default=4)
    p.add_argument("--json", default=None, help="also write the rows to this file")
    a = p.parse_args(argv)
    if a.iters <= a.warmup:
        p.error("--iters must be more than --warmup")
    work = tempfile.mkdtemp(prefix="vision-bench-")
    sizes = write_pictures(work, a.samples, a.min_side, a.max_side)
    largest = max(h * w for h, w in sizes)
    native, padded = vision_tokens(sizes, None), vision_tokens(sizes, largest)
    seq_length = 64 * -(-(max(padded) + 48) // 64)  # the largest image's tokens and the text, rounded up
    common = ["--backend", a.backend, "--model", a.model, "--model-size", a.model_size, "--data-path",
              os.path.join(work, "data.jsonl"), "--image-folder", os.path.join(work, "images"),
              "--seq-length", str(seq_length), "--max-position-embeddings", str(seq_length),
              "--micro-batch-size", str(a.micro_batch_size), "--global-batch-size", str(a.micro_batch_size),
              "--train-iters", str(a.iters), "--lr", "1e-4", "--lr-decay-style", "constant", "--eval-iters", "0",
              "--num-samples", "0", "--log-interval", "1000", "--split", "100,0,0"]
    rows, failed = [], False
    for name, extra, tokens in (("native resolution", [], native),
                                (f"padded to the largest ({largest} px)", ["--min-pixels", str(largest)], padded)):
        try:
            metrics = run(common + extra, os.path.join(work, name.split()[0]))
        except RuntimeError as e:
            print(f"{name}: {e}", file=sys.stderr)
            failed = True
            continue
        step_ms = statistics.median(m["step_time_ms"] for m in metrics[a.warmup:])
        per_step_vision = sum(tokens) / len(tokens) * a.micro_batch_size
        rows.append({"run": name, "step_ms": step_ms, "vision_tokens_per_step": per_step_vision,
                     "vision_tokens_per_s": per_step_vision / (step_ms / 1000)})
    if rows:
        base = rows[0]["step_ms"]
        print(f"{a.model} {a.model_size}, {a.backend}, {a.samples} pictures {a.min_side}-{a.max_side} px, "
              f"micro-batch {a.micro_batch_size}, seq {seq_length}, median of steps {a.warmup + 1}-{a.iters}")
        print(f"{'run':<36} {'step ms':>9} {'vision tok/step':>16} {'vision tok/s':>12} {'step / native':>14}")
        for r in rows:
            print(f"{r['run']:<36} {r['step_ms']:>9.1f} {r['vision_tokens_per_step']:>16.0f} "
                  f"{r['vision_tokens_per_s']:>12.0f} {r['step_ms'] / base:>14.2f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
