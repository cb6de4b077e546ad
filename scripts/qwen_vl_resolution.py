"""What native (dynamic) resolution buys: the tiny Qwen2.5-VL trained on the embedded fine-detail task
(mtmegatron/data/vision/textures.py: which of four one-pixel patterns fills a box in a 112-196 pixel picture)
at native resolution and with every picture shrunk to at most 56x56 pixels (``--max-pixels 3136``, HF's image
processor bound), the same recipe and seed otherwise; prints each run's held-out answer accuracy
(``answer_eval.json``: every answer token the greedy choice, tasks/qwen_vl/answer_eval.py) and chance (the most
frequent held-out answer's share).

Usage: python scripts/qwen_vl_resolution.py [--seeds 1 2 3] [--train-iters 80] [--work-dir DIR]
One run is a 1-rank ``python -m mtmegatron.pretrain --backend cpu`` of about 20-40 s on a free CPU core; the seed
changes the model's initialisation and the data order, not the data set. tests/models/test_qwen_vl_learning.py runs
one seed of this recipe (``flags``).
May assume: mtmegatron installed; the cpu backend.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

from mtmegatron.data.vision import textures

TRAIN_ITERS = 80
FIXED_PIXELS = 56 * 56
RESOLUTIONS = {"native": [], "fixed": ["--max-pixels", str(FIXED_PIXELS)]}
RECIPE = ["--backend", "cpu", "--model", "qwen2.5-vl", "--model-size", "tiny", "--global-batch-size", "8",
          "--micro-batch-size", "4", "--lr", "1e-3", "--lr-decay-style", "constant", "--lr-warmup-iters", "10",
          "--hidden-dropout", "0", "--attention-dropout", "0", "--eval-iters", "1", "--log-interval", "20"]


def flags(data_dir: str, resolution: str, seed: int, train_iters: int = TRAIN_ITERS) -> list[str]:
    """The pretrain flags of one run (``resolution``: a key of RESOLUTIONS); held-out evaluation only at the end."""
    return RECIPE + ["--train-data-path", os.path.join(data_dir, "train.jsonl"), "--valid-data-path",
                     os.path.join(data_dir, "valid.jsonl"), "--seed", str(seed), "--train-iters", str(train_iters),
                     "--eval-interval", str(10 * train_iters)] + RESOLUTIONS[resolution]


def run(data_dir: str, resolution: str, seed: int, log_dir: str, train_iters: int) -> dict:
    """One run's ``answer_eval.json`` with its first and last training loss."""
    command = [sys.executable, "-m", "mtmegatron.pretrain", *flags(data_dir, resolution, seed, train_iters),
               "--log-dir", log_dir]
    proc = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    if proc.returncode != 0:
        raise SystemExit(f"{resolution} seed {seed} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    with open(os.path.join(log_dir, "metrics.jsonl")) as f:
        losses = [json.loads(line)["loss"] for line in f]
    with open(os.path.join(log_dir, "answer_eval.json")) as f:
        return {**json.load(f), "first_loss": losses[0], "last_loss": losses[-1]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--train-iters", type=int, default=TRAIN_ITERS)
    p.add_argument("--work-dir", default=None, help="keep the runs' logs here (default: a temporary folder)")
    a = p.parse_args(argv)
    data_dir = textures.prepare()
    chance = textures.chance(os.path.join(data_dir, "valid.jsonl"))
    work = a.work_dir or tempfile.mkdtemp(prefix="qwen_vl_resolution-")
    print(f"{'resolution':<22} {'seed':>4} {'held-out accuracy':>18} {'loss first -> last':>20}")
    for seed in a.seeds:
        for resolution in RESOLUTIONS:
            result = run(data_dir, resolution, seed, os.path.join(work, f"{resolution}-seed{seed}"), a.train_iters)
            name = "native (dynamic)" if resolution == "native" else f"fixed (<= {FIXED_PIXELS} px)"
            print(f"{name:<22} {seed:>4} {result['answer_accuracy']:>18.1%} "
                  f"{result['first_loss']:>9.3f} -> {result['last_loss']:<8.3f}", flush=True)
    print(f"chance (most frequent held-out answer): {chance:.1%} of {result['held_out_samples']} held-out samples")
    return 0


if __name__ == "__main__":
    sys.exit(main())
