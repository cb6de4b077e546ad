"""Packed (THD) vision conversations and context parallelism for ``--model qwen2-vl|qwen2.5-vl``
(``--vision-packing thd|padded``: tasks/qwen_vl/thd.py; ``--context-parallel-size``: the vision embeddings
merged into the whole sequence before it is cut over CP, tasks/qwen_vl/step.py, models/families/qwen2_vl/model.py).

Checked: the bins are SFT's plan (sft/packing.py) and hold every conversation once; the packed layout (cu_seqlens
per conversation, padded ones under CP, each conversation's own 3-D positions, the same answer tokens and pictures
as the padded layout of the same bins; which positions each CP rank holds); and the per-iteration losses of a tiny
Qwen2.5-VL (fp32, dropout 0, 3 steps of 4 bins of 384 tokens, 2 bins per micro-batch; records cycling two images
in a turn, a 4-frame video, text only, one image) packed (``thd``) vs padded (``padded``, the same bins): TP2 with
sequence parallelism (against the one-rank padded run: TP gives the one-rank losses), PP2 (vision
encoder and one language layer on stage 0; PP's initial weights differ from one rank's, so packed and padded PP2 are
compared with each other), CP2 (packed CP2 vs the one-rank padded run: for these records the plan at CP2, each
conversation rounded up to 4 tokens, groups them as at one rank; a padded CP2 run, measured equal to both within
2e-7, was folded away for CI time; so was a one-rank packed run, measured within 4e-7 of the one-rank padded run: the
packed layout is held to the one-rank padded losses under TP2+SP and CP2, to padded PP2 under PP2). Both layouts hold
the same
conversations per micro-batch and take the mean over the same answer tokens, so the losses are comparable as they
are; measured differences are at most 2e-7, the tolerance here is 1e-5.
Cost: five short runs (one one-rank, four two-rank of 3 steps; seven before the folds); the other checks a few
seconds.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

from helpers.pretrain_runner import run_pretrain
from mtmegatron.sft.packing import first_fit_decreasing
from mtmegatron.tasks.qwen_vl.thd import Bins, collate_packed, collate_padded_bins, cp_positions

TOLERANCE = 1e-5
FLAGS = ["--backend", "cpu", "--model", "qwen2.5-vl", "--model-size", "tiny", "--seq-length", "384",
         "--max-position-embeddings", "384", "--train-iters", "3", "--global-batch-size", "4", "--micro-batch-size",
         "2", "--lr", "1e-3", "--lr-decay-style", "constant", "--hidden-dropout", "0", "--attention-dropout", "0",
         "--eval-iters", "0", "--log-interval", "100"]
PACK = ["--vision-packing", "thd"]
PAD = ["--vision-packing", "padded"]
PP2 = ["--pipeline-model-parallel-size", "2", "--decoder-first-pipeline-num-layers", "1"]
CP2 = ["--context-parallel-size", "2"]
RUNS = {"padded": (1, PAD),
        "packed-tp2-sp": (2, ["--tensor-model-parallel-size", "2", "--sequence-parallel"] + PACK),
        "padded-pp2": (2, PP2 + PAD), "packed-pp2": (2, PP2 + PACK),
        "packed-cp2": (2, CP2 + PACK)}


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


@pytest.mark.parametrize("packed, padded", [("packed-tp2-sp", "padded"),
                                            ("packed-pp2", "padded-pp2"), ("packed-cp2", "padded")])
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
    bins = [[_sample(5, 1, 100), _sample(6, 0, 200)], [_sample(7, 2, 300)]]  # a micro-batch of two bins
    batch = collate_packed(bins, pad_id=0, seq_length=16, multiple=multiple)
    padded = collate_padded_bins(bins, pad_id=0, seq_length=16, rows=4)  # mbs 2 x the fullest bin's 2
    assert batch["tokens"].shape == (1, 32) and batch["position_ids"].shape == (3, 1, 32)
    assert padded["tokens"].shape == (4, 16) and padded["loss_mask"][3].sum() == 0
    if multiple == 1:  # each bin's tail its own loss-free sequence
        starts, cu = [0, 5, 16], [0, 5, 11, 16, 23, 32]
    else:  # each conversation padded up to the multiple under CP
        starts, cu = [0, 8, 16], [0, 5, 11, 18, 26]
        assert batch["cu_seqlens_padded"].tolist() == [0, 8, 16, 24, 32]
    assert batch["cu_seqlens"].tolist() == cu and ("cu_seqlens_padded" in batch) == (multiple > 1)
    for sample, start in zip([s for b in bins for s in b], starts):
        n = len(sample["tokens"])
        assert torch.equal(batch["tokens"][0, start:start + n], sample["tokens"])
        assert torch.equal(batch["position_ids"][:, 0, start:start + n], sample["position_ids"])
    assert batch["loss_mask"].sum() == padded["loss_mask"].sum() == 6
    assert torch.equal(batch["labels"][batch["loss_mask"] > 0], padded["labels"][padded["loss_mask"] > 0])
    for key in ("pixel_values", "image_grid_thw"):
        assert torch.equal(batch[key], padded[key])


class _Conversations(torch.utils.data.Dataset):
    lengths = [9, 3, 12, 5, 7, 16, 2, 4]
    loads = [10 * n for n in lengths]

    def __len__(self):
        return len(self.lengths)

    def __getitem__(self, i):
        return i


def test_the_bins_are_sfts_plan_and_hold_every_conversation_once():
    bins = Bins(_Conversations(), seq_length=16, multiple=4, seed=3)
    assert bins.bins == first_fit_decreasing(np.array([12, 4, 12, 8, 8, 16, 4, 4]), 16, 3)
    assert sorted(i for b in bins for i in b) == list(range(8))
    assert all(sum(-(-_Conversations.lengths[i] // 4) * 4 for i in b) <= 16 for b in bins.bins)
    assert bins.loads == [sum(_Conversations.loads[i] for i in b) for b in bins.bins]


def test_each_cp_rank_holds_its_chunks_of_every_conversation():
    bins = [[_sample(5, 1, 100), _sample(6, 0, 200)], [_sample(7, 2, 300)]]
    batch = collate_packed(bins, pad_id=0, seq_length=16, multiple=4)  # sequences of 8 at 0, 8, 16, 24
    held = [cp_positions(batch, 2, rank).tolist() for rank in range(2)]
    assert held[0] == [0, 1, 6, 7, 8, 9, 14, 15, 16, 17, 22, 23, 24, 25, 30, 31]
    assert sorted(held[0] + held[1]) == list(range(32))
    row = {"tokens": torch.zeros(2, 16)}  # a padded batch: the row's four chunks, megatron-core's load balance
    assert cp_positions(row, 2, 0).tolist() == [0, 1, 2, 3, 12, 13, 14, 15]
    assert cp_positions(row, 2, 1).tolist() == [4, 5, 6, 7, 8, 9, 10, 11]


def test_packing_without_conversations_is_one_line():
    from mtmegatron.config.arguments import parse_args
    from mtmegatron.utils.errors import ConfigError

    with pytest.raises(ConfigError, match="--vision-packing thd packs image/video conversations: give --data-path"):
        parse_args(["--backend", "cpu", "--model", "qwen2.5-vl", "--model-size", "tiny", "--mock-data",
                    "--vision-packing", "thd"])  # a CHECKS entry (tasks/qwen_vl/data.check_balance)


def test_a_resumed_run_reads_the_same_bins():
    """What a global batch holds is a function of the plan and the consumed count: a run resumed after
    iteration 3 reads what the uninterrupted run reads from iteration 4 on (across the epoch boundary)."""
    from mtmegatron.data.position import SamplePlan
    from mtmegatron.data.section import Batches
    from mtmegatron.config.arguments import parse_args
    from mtmegatron.tasks.llava.data import MicroBatches
    from mtmegatron.tasks.section import VisionReading

    args = parse_args(["--backend", "cpu", "--model", "qwen2.5-vl", "--model-size", "tiny", "--mock-data",
                       "--global-batch-size", "4", "--micro-batch-size", "2"])
    bins = Bins(_Conversations(), seq_length=16, multiple=1, seed=3)

    def read(start: int, micro_batches: int) -> list:
        plan = SamplePlan(Batches.of(args), args.data_parallel_size, start)
        reader = MicroBatches(bins, lambda batch: batch, VisionReading.of(args), 0, plan, shuffle=True)
        return [next(reader) for _ in range(micro_batches)]

    whole = read(0, 12)
    assert read(3, 6) == whole[6:]
    assert sorted(i for micro in whole[:len(bins) // 2] for b in micro for i in b) == list(range(8))
