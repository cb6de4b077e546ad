"""The accelerator lane for the native-resolution vision-language models: ``--model qwen2.5-vl`` at DP2 with the
distributed optimizer on ``--backend musa`` under the simulated MUSA device (tests/musa_sim: a device that is not
the host, real torchada, an ``mccl`` that refuses host tensors) against the same run on ``--backend cpu``.

The musa run also balances its micro-batches (``--balance-micro-batches``: each global batch's samples dealt over
the two ranks by text tokens + vision patches), the cpu run reads contiguous slices: each global batch holds the
same samples either way, so the losses agree within the lane's 1e-5 (the gradient sums in another order). Checked:
per-iteration losses; the balance start-up line with a lower per-rank peak than the contiguous slices on images
from 28x28 to 224x168 pixels; rank 0's placement line (every parameter, buffer, gradient buffer and optimizer state
of both towers on ``musa:<LOCAL_RANK>``: training/placement.py); the pixel patches reach the device (the simulator
would stop a host tensor meeting a device weight); every rank's ``mccl`` group ran collectives and refused no host
tensor. Cost: two 2-rank runs of 3 steps (~40 s on 2 cores).
"""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest
from PIL import Image

from helpers.musa_sim import assert_device_run, sim_env
from helpers.pretrain_runner import run_pretrain

pytestmark = pytest.mark.musa_sim

ITERS = 3
LOSS_TOL = 1e-5
SIZES = [(28, 28), (224, 168), (56, 28), (28, 56), (112, 112), (28, 28), (168, 84), (28, 28)]  # (width, height)
ARGS = ["--model", "qwen2.5-vl", "--model-size", "tiny", "--train-iters", str(ITERS), "--global-batch-size", "8",
        "--micro-batch-size", "2", "--use-distributed-optimizer", "--lr", "1e-3", "--lr-decay-style", "constant",
        "--hidden-dropout", "0", "--attention-dropout", "0", "--eval-iters", "0", "--log-interval", "100",
        "--seq-length", "256", "--max-position-embeddings", "256", "--num-samples", "0",
        "--use-cpu-initialization"]  # host init on both backends: the weights the cpu backend builds


def _conversations(root) -> list[str]:
    """Pictures of very different areas with a square to find, and the JSONL asking where it is."""
    (root / "images").mkdir()
    rng = np.random.default_rng(1)
    records = []
    for i in range(32):
        width, height = SIZES[i % len(SIZES)]
        pixels = rng.integers(0, 60, (height, width, 3), dtype=np.uint8)
        left = bool(rng.integers(2))
        x = int(rng.integers(0, width // 2 - width // 4 + 1)) + (0 if left else width // 2)
        pixels[height // 4:height // 4 + height // 3, x:x + width // 4] = 230
        Image.fromarray(pixels).save(root / "images" / f"p{i}.png")
        records.append({"id": f"p{i}", "image": f"p{i}.png", "conversations": [
            {"from": "human", "value": "<image>\nIs the square on the left or the right?"},
            {"from": "gpt", "value": "left" if left else "right"}]})
    (root / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return ["--data-path", str(root / "data.jsonl"), "--image-folder", str(root / "images")]


def test_qwen_vl_dp2_on_the_simulated_device_matches_the_cpu_backend(tmp_path):
    data = _conversations(tmp_path)
    stats = tmp_path / "stats"
    musa, musa_rows = run_pretrain(2, ["--backend", "musa", *ARGS, *data, "--balance-micro-batches"],
                                   tmp_path / "musa", timeout=400, env=sim_env({"MUSA_SIM_STATS_DIR": str(stats)}))
    _, cpu_rows = run_pretrain(2, ["--backend", "cpu", *ARGS, *data], tmp_path / "cpu", timeout=400)

    assert [r["iteration"] for r in musa_rows] == [r["iteration"] for r in cpu_rows] == list(range(1, ITERS + 1))
    for m, c in zip(musa_rows, cpu_rows):
        assert math.isfinite(m["loss"]) and abs(m["loss"] - c["loss"]) <= LOSS_TOL, (m["iteration"], m, c)
    balance = re.search(r"per DP rank (\d+\.\d+) -> (\d+\.\d+)", musa.stdout)
    assert balance, musa.stdout[-3000:]
    assert float(balance.group(2)) < float(balance.group(1)), balance.group(0)
    print(balance.group(0), "| largest loss difference", max(abs(m["loss"] - c["loss"]) for m, c in zip(musa_rows, cpu_rows)))

    assert_device_run(musa.stdout, stats)
