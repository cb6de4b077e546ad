"""Packed (THD) vision conversations and context parallelism for ``--model qwen2-vl|qwen2.5-vl``
(``--pack-vision-conversations``: training/packed_vision_thd.py; ``--context-parallel-size``: the vision embeddings
merged into the whole sequence before it is cut over CP, training/packed_vision_step.py, models/qwen_vl.py).

Checked: the packed layout itself (cu_seqlens per conversation, padded ones under CP, each conversation's own 3-D
positions, the same answer tokens and pictures as the padded batch; which positions each CP rank holds); and the
per-iteration losses of a tiny Qwen2.5-VL (fp32, dropout 0, 3 steps of 4 conversations, 2 per micro-batch: two
images in a turn, a 4-frame video, text only, one image) packed vs padded: at one rank, TP2 with sequence
parallelism (against the one-rank padded run: TP gives the one-rank losses), PP2 (vision encoder and one language
layer on stage 0; PP's initial weights differ from one rank's, so packed and padded PP2 are compared with each
other), CP2 (packed CP2 vs padded CP2, and padded CP2 vs one rank). Both layouts hold the same conversations per
micro-batch and take the mean over the same answer tokens, so the losses are comparable as they are; measured
differences are at most 3.1e-6 (float rounding of another attention layout), the tolerance here is 1e-5.
Cost: seven short runs (two one-rank, five two-rank of 3 steps): 102 s wall at load average 7-13 on 2 CPU cores,
83 s CPU time in all; the layout checks well under a second.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

from helpers.pretrain_runner import run_pretrain
from mtmegatron.data.multimodal.vision_samples import collate_padded
from mtmegatron.training.packed_vision_thd import collate_packed, cp_positions

TOLERANCE = 1e-5
FLAGS = ["--backend", "cpu", "--model", "qwen2.5-vl", "--model-size", "tiny", "--seq-length", "384",
         "--max-position-embeddings", "384", "--train-iters", "3", "--global-batch-size", "4", "--micro-batch-size",
         "2", "--lr", "1e-3", "--lr-decay-style", "constant", "--hidden-dropout", "0", "--attention-dropout", "0",
         "--eval-iters", "0", "--log-interval", "100"]
PACK = ["--pack-vision-conversations"]
PP2 = ["--pipeline-model-parallel-size", "2", "--decoder-first-pipeline-num-layers", "1"]
CP2 = ["--context-parallel-size", "2"]
RUNS = {"padded": (1, []), "packed": (1, PACK),
        "packed-tp2-sp": (2, ["--tensor-model-parallel-size", "2", "--sequence-parallel"] + PACK),
        "padded-pp2": (2, PP2), "packed-pp2": (2, PP2 + PACK),
        "padded-cp2": (2, CP2), "packed-cp2": (2, CP2 + PACK)}


def write_conversations(root) -> str:
    """16 records cycling: two images in one turn, a video (a folder of 4 frames), text only, one image."""
    rng = np.random.default_rng(1)
    (root / "frames").mkdir()
    for i in range(4):
        Image.fromarray(rng.integers(0, 255, (48 + 8 * i, 64, 3), dtype=np.uint8)).save(root / f"i{i}.png")
        Image.fromarray(rng.integers(0, 255, (60, 80, 3), dtype=np.uint8)).save(root / "frames" / f"f{i}.png")
    kinds = [({"image": ["i0.png", "i1.png"]}, "<image>\n<image>\nCompare.", "They differ."),
             ({"video": "frames"}, "<video>\nWhat happens?", "Noise moves."), ({}, "Say hi.", "hi")]
    records = []
    for k in range(16):
        media, question, answer = kinds[k % 4] if k % 4 < 3 else ({"image": f"i{k % 4}.png"}, "<image>\nWhat?", "noise")
        turns = [{"from": "human", "value": question}, {"from": "gpt", "value": answer}]
        records.append({"id": str(k), **media, "conversations": turns})
    path = root / "data.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


@pytest.fixture(scope="module")
def losses(tmp_path_factory):
    root = tmp_path_factory.mktemp("qwen_vl_packed")
    data = ["--data-path", write_conversations(root)]
    out = {}
    for name, (ranks, flags) in RUNS.items():
        _, rows = run_pretrain(ranks, FLAGS + data + flags, root / name, timeout=600)
        out[name] = [row["loss"] for row in rows]
        print(f"{name}: losses {' '.join(f'{loss:.7f}' for loss in out[name])}")
    return out


@pytest.mark.parametrize("packed, padded", [("packed", "padded"), ("packed-tp2-sp", "padded"),
                                            ("packed-pp2", "padded-pp2"), ("packed-cp2", "padded-cp2"),
                                            ("padded-cp2", "padded")])
def test_packed_and_padded_losses_agree(losses, packed, padded):
    assert len(losses[packed]) == 3
    assert losses[packed] == pytest.approx(losses[padded], abs=TOLERANCE, rel=0)


def _sample(length: int, images: int, start: int) -> dict:
    """A fake conversation: tokens ``start...``, an answer on its last two labels, ``images`` 4-patch images."""
    labels = torch.full((length,), -100)
    labels[-3:-1] = 7
    return {"tokens": torch.arange(start, start + length), "labels": labels, "loss_mask": (labels != -100).float(),
            "position_ids": torch.arange(length).expand(3, -1) + torch.tensor([[0], [1], [2]]),
            "pixel_values": torch.randn(4 * images, 6), "image_grid_thw": torch.tensor([[1, 2, 2]] * images),
            "pixel_values_videos": torch.zeros(0, 6), "video_grid_thw": torch.zeros(0, 3, dtype=torch.long),
            "second_per_grid_ts": torch.zeros(0)}


@pytest.mark.parametrize("multiple", [1, 4])
def test_the_packed_row_keeps_each_conversation_whole(multiple):
    samples = [_sample(5, 1, 100), _sample(9, 2, 200)]
    batch = collate_packed(samples, pad_id=0, seq_length=16, multiple=multiple)
    padded = collate_padded(samples, pad_id=0, length=16)
    assert batch["tokens"].shape == (1, 32) and batch["position_ids"].shape == (3, 1, 32)
    lengths = [5, 9] if multiple == 1 else [8, 12]  # each conversation padded up to the multiple under CP
    starts = [0, lengths[0]]
    assert batch["cu_seqlens"].tolist() == [0, 5, 5 + 9, 5 + 9 + 32 - sum(lengths)]
    if multiple > 1:
        assert batch["cu_seqlens_padded"].tolist() == [0, 8, 20, 32]
    else:
        assert "cu_seqlens_padded" not in batch
    for sample, start in zip(samples, starts):
        n = len(sample["tokens"])
        assert torch.equal(batch["tokens"][0, start:start + n], sample["tokens"])
        assert torch.equal(batch["position_ids"][:, 0, start:start + n], sample["position_ids"])
    assert batch["loss_mask"].sum() == padded["loss_mask"].sum() == 4
    assert torch.equal(batch["labels"][batch["loss_mask"] > 0], padded["labels"][padded["loss_mask"] > 0])
    for key in ("pixel_values", "image_grid_thw"):
        assert torch.equal(batch[key], padded[key])


def test_each_cp_rank_holds_its_chunks_of_every_conversation():
    samples = [_sample(5, 1, 100), _sample(9, 2, 200)]
    batch = collate_packed(samples, pad_id=0, seq_length=16, multiple=4)  # sequences [0, 8) [8, 20) [20, 32)
    held = [cp_positions(batch, 2, rank).tolist() for rank in range(2)]
    assert held[0] == [0, 1, 6, 7, 8, 9, 10, 17, 18, 19, 20, 21, 22, 29, 30, 31]
    assert sorted(held[0] + held[1]) == list(range(32))
    row = {"tokens": torch.zeros(2, 16)}  # a padded batch: the row's four chunks, megatron-core's load balance
    assert cp_positions(row, 2, 0).tolist() == [0, 1, 2, 3, 12, 13, 14, 15]
    assert cp_positions(row, 2, 1).tolist() == [4, 5, 6, 7, 8, 9, 10, 11]
