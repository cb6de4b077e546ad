"""``--model llava`` on user data (LLaVA JSONL + an image folder) with tiling and several images per sample.

The embedded shapes dataset renders every image at the tile size, so each sample there has exactly one tile and
the samples of a micro-batch always have the same combined length. Real data does not: images of other aspect
ratios tile into different grids (plus a thumbnail), some samples hold two images, and LLaVAModel then cuts the
micro-batch's combined sequence back to ``--decoder-seq-length`` by slicing (a non-contiguous loss mask; the
loss once failed there). Checked: TP2+SP with two samples per micro-batch trains and its losses equal the
single-rank run's; both count the same image tokens per step, more than one tile per image would give, and
different from step to step.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from helpers.pretrain_runner import run_pretrain

SIZES = [(64, 32), (32, 64), (48, 48)]  # (width, height): 2x1, 1x2 and square grids at 16 px tiles
COMMON = ["--backend", "cpu", "--model", "llava", "--use-tiling", "--max-num-tiles", "4", "--use-thumbnail",
          "--img-h", "16", "--img-w", "16", "--patch-dim", "8", "--train-iters", "3", "--global-batch-size", "4",
          "--micro-batch-size", "2", "--hidden-dropout", "0", "--attention-dropout", "0", "--eval-iters", "0",
          "--log-interval", "100", "--num-samples", "0"]


def _write_dataset(root) -> str:
    rng = np.random.default_rng(0)
    records = []
    for i in range(24):
        width, height = SIZES[i % 3]
        Image.fromarray(rng.integers(0, 255, (height, width, 3), dtype=np.uint8)).save(root / f"img{i}.png")
        images = [f"img{i}.png"] + ([f"img{(i + 1) % 24}.png"] if i % 4 == 0 else [])
        records.append({"id": str(i), "image": images if len(images) > 1 else images[0], "conversations": [
            {"from": "human", "value": "<image>\n" * len(images) + "What is this?"},
            {"from": "gpt", "value": f"noise number {i}"}]})
    path = root / "data.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in records))
    return str(path)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("llava_real")
    data = ["--data-path", _write_dataset(root)]
    _, single = run_pretrain(1, COMMON + data, root / "single", timeout=600)
    _, tp2 = run_pretrain(2, COMMON + data + ["--tensor-model-parallel-size", "2", "--sequence-parallel"],
                          root / "tp2", timeout=600)
    return single, tp2


def test_mixed_tiles_train_under_tp2_sp_like_one_rank(runs):
    single, tp2 = runs
    assert len(single) == len(tp2) == 3
    for a, b in zip(single, tp2):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-4)
        assert a["image_tokens"] == b["image_tokens"]
    # 4 image embeddings per 16 px tile; every image has >= 2 tiles + thumbnail, some samples two images: a step
    # of 4 samples holds more than the 4 x 4 one-tile-per-sample minimum, and the steps differ
    assert all(row["image_tokens"] > 16 for row in single)
    assert len({row["image_tokens"] for row in single}) > 1
