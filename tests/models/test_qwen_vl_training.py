"""``pretrain --model qwen2-vl|qwen2.5-vl --data-path conversations.jsonl`` trains with images end to end
(tasks/qwen_vl/data.py, tasks/qwen_vl/step.py), on a small copy of the embedded fine-detail task
(data/vision/textures.py: which of four one-pixel patterns fills a box in a 112-196 pixel picture, 16 to 49
merged image tokens each; the JSONL here, the pictures in the cache: ``--image-folder``).

Checked (tiny presets, 6 steps of 4 samples, loss on the answer tokens only): the loss falls at one rank for both
families; Qwen2.5-VL with TP2 and sequence parallelism gives its one-rank losses; Qwen2.5-VL with PP2 and two
virtual stages per rank (VPP: the vision encoder in the first virtual chunk of stage 0, one language layer per
chunk) trains too (its initial weights differ from one rank's, as for text-only runs of this model, so only its own
fall is checked) and scores its held-out answers through the interleaved pipeline (``answer_eval.json``); PP2 with
the non-uniform split (the vision encoder and one language layer on stage 0, ``--decoder-first-pipeline-num-layers
1``) on the same task is the launcher's test (tests/test_examples.py); with the language model frozen
the loss still falls (only the vision encoder and merger learn: the gradient reaches them through the images); a
record whose image is missing stops the run with exit 2 and one line naming file:line and the record's id; so does
a ``--tokenizer-model`` whose image token id is not the preset's. Mixed media (two images in a turn, a video given
as a frame folder, text-only records; qwen2.5-vl, one sample per micro-batch) trains, and DP2 with the distributed
optimizer and ``--overlap-grad-reduce`` gives the one-rank losses. That the task is learned, and needs the
resolution: tests/models/test_qwen_vl_learning.py.
Cost: 90-180 s on 2 CPU cores (seven short training runs, three of them on two ranks, and two refused starts;
the upper figure measured with the cores shared by other jobs; 250 s for the five fixture runs at load average 15).
The task's pictures cost no more than the rectangles this file generated before (6.0-6.4 s CPU per 1-rank run).
"""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest
from PIL import Image

from helpers.pretrain_runner import run_pretrain
from mtmegatron.data.vision import textures

RED = (220, 30, 30)
COMMON = ["--backend", "cpu", "--model-size", "tiny", "--train-iters", "6", "--global-batch-size", "4",
          "--micro-batch-size", "2", "--lr", "1e-3", "--lr-decay-style", "constant", "--hidden-dropout", "0",
          "--attention-dropout", "0", "--eval-iters", "0", "--log-interval", "100"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("qwen_vl_training")
    pictures = textures.prepare(num_train=64, num_valid=16)
    for split in ("train", "valid"):  # the conversations here, the pictures where --image-folder says
        shutil.copy(os.path.join(pictures, f"{split}.jsonl"), root / f"{split}.jsonl")
    data = ["--train-data-path", str(root / "train.jsonl"), "--valid-data-path", str(root / "valid.jsonl"),
            "--image-folder", pictures]
    layouts = {
        "qwen2-vl": (1, ["--model", "qwen2-vl"]),
        "qwen2.5-vl": (1, ["--model", "qwen2.5-vl"]),
        "tp2-sp": (2, ["--model", "qwen2.5-vl", "--tensor-model-parallel-size", "2", "--sequence-parallel"]),
        # gloo: no p2p overlap of the interleaved schedule (models/gpt.p2p_overlap_runs)
        "pp2-vpp2": (2, ["--model", "qwen2.5-vl", "--pipeline-model-parallel-size", "2",
                         "--num-layers-per-virtual-pipeline-stage", "1", "--no-overlap-p2p-communication",
                         "--eval-iters", "1"]),
        "frozen-lm": (1, ["--model", "qwen2-vl", "--freeze-LM"]),
    }
    out = {}
    for name, (ranks, flags) in layouts.items():
        _, rows = run_pretrain(ranks, COMMON + data + flags, root / name, timeout=600)
        out[name] = [row["loss"] for row in rows]
        print(f"{name}: losses {' '.join(f'{loss:.3f}' for loss in out[name])}")
    out["pp2-vpp2-answer-eval"] = json.loads((root / "pp2-vpp2" / "answer_eval.json").read_text())
    return out


@pytest.mark.parametrize("layout", ["qwen2-vl", "qwen2.5-vl", "pp2-vpp2"])
def test_loss_falls(runs, layout):
    losses = runs[layout]
    assert len(losses) == 6
    assert losses[-1] < 0.8 * losses[0], losses


def test_tp2_with_sequence_parallelism_gives_the_one_rank_losses(runs):
    assert runs["tp2-sp"] == pytest.approx(runs["qwen2.5-vl"], rel=1e-4)


def test_pp2_vpp2_scores_the_held_out_answers_through_the_pipeline(runs):
    result = runs["pp2-vpp2-answer-eval"]
    assert result["held_out_samples"] == 16  # the whole held-out set: 4 global batches of 4
    assert 0.0 <= result["answer_accuracy"] <= 1.0


def test_with_the_language_model_frozen_the_images_alone_lower_the_loss(runs):
    losses = runs["frozen-lm"]
    assert losses[0] == pytest.approx(runs["qwen2-vl"][0], rel=1e-6)  # same model, same first batch
    assert losses[-1] < losses[0] - 0.1, losses


def test_a_missing_image_is_one_line_naming_file_and_record(tmp_path):
    Image.new("RGB", (56, 56), RED).save(tmp_path / "here.png")
    turns = [{"from": "human", "value": "<image>\nWhat colour is it?"}, {"from": "gpt", "value": "red"}]
    path = tmp_path / "data.jsonl"
    path.write_text(json.dumps({"id": "ok", "image": "here.png", "conversations": turns}) + "\n"
                    + json.dumps({"id": "lost", "image": "gone.png", "conversations": turns}) + "\n")
    proc, rows = run_pretrain(1, COMMON + ["--model", "qwen2-vl", "--data-path", str(path)], tmp_path / "run",
                              expect_ok=False)
    assert proc.returncode == 2 and not rows
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert f"{path}:2" in lines[0] and "'lost'" in lines[0] and "gone.png" in lines[0]


def test_a_tokenizer_whose_image_id_the_model_does_not_read_is_refused(tmp_path):
    from mtmegatron.data.vision.qwen_vl_chat import SPECIAL_TOKENS
    from mtmegatron.data.tokenizer import train_bpe

    Image.new("RGB", (56, 56), RED).save(tmp_path / "here.png")
    turns = [{"from": "human", "value": "<image>\nWhat colour is it?"}, {"from": "gpt", "value": "red"}]
    path = tmp_path / "data.jsonl"
    path.write_text(json.dumps({"id": "ok", "image": "here.png", "conversations": turns}) + "\n")
    tokenizer = train_bpe(["What colour is it? red"], 300, str(tmp_path / "tok"), SPECIAL_TOKENS)
    image_id = tokenizer.tokenizer.token_to_id("<|image_pad|>")
    proc, _ = run_pretrain(1, COMMON + ["--model", "qwen2-vl", "--data-path", str(path), "--tokenizer-model",
                                        str(tmp_path / "tok")], tmp_path / "run", expect_ok=False)
    assert proc.returncode == 2
    assert f"<|image_pad|> is id {image_id} but --model qwen2-vl --model-size tiny reads id 1020" in proc.stderr


def write_mixed_media(root) -> str:
    """16 records: two images in one turn, a video (a folder of 4 frames), text only, one image — in turn."""
    rng = np.random.default_rng(1)
    (root / "frames").mkdir()
    for i in range(4):
        Image.fromarray(rng.integers(0, 255, (48 + 8 * i, 64, 3), dtype=np.uint8)).save(root / f"i{i}.png")
        Image.fromarray(rng.integers(0, 255, (60, 80, 3), dtype=np.uint8)).save(root / "frames" / f"f{i}.png")
    kinds = [{"image": ["i0.png", "i1.png"], "q": "<image>\n<image>\nCompare.", "a": "They differ."},
             {"video": "frames", "q": "<video>\nWhat happens?", "a": "Noise moves."},
             {"q": "Say hi.", "a": "hi"}]
    records = []
    for k in range(16):
        kind = dict(kinds[k % 4]) if k % 4 < 3 else {"image": f"i{k % 4}.png", "q": "<image>\nWhat?", "a": "noise"}
        turns = [{"from": "human", "value": kind.pop("q")}, {"from": "gpt", "value": kind.pop("a")}]
        records.append({"id": str(k), **kind, "conversations": turns})
    path = root / "data.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


def test_images_videos_and_text_only_micro_batches_train_alike_under_dp2(tmp_path):
    """One sample per micro-batch, so some micro-batches hold no pixels (the encoder's zero gradient keeps
    megatron-core's --overlap-grad-reduce bucket count whole); DP2 with the distributed optimizer = one rank."""
    flags = ["--backend", "cpu", "--model", "qwen2.5-vl", "--model-size", "tiny", "--data-path",
             write_mixed_media(tmp_path), "--seq-length", "512", "--max-position-embeddings", "512",
             "--train-iters", "4", "--global-batch-size", "4", "--micro-batch-size", "1", "--lr", "1e-3",
             "--lr-decay-style", "constant", "--hidden-dropout", "0", "--attention-dropout", "0", "--eval-iters", "0",
             "--log-interval", "100"]
    _, one = run_pretrain(1, flags, tmp_path / "one", timeout=600)
    _, dp2 = run_pretrain(2, flags + ["--use-distributed-optimizer", "--overlap-grad-reduce"], tmp_path / "dp2",
                          timeout=600)
    losses = [row["loss"] for row in one]
    assert len(losses) == 4 and losses[-1] < 0.85 * losses[0], losses
    assert [row["loss"] for row in dp2] == pytest.approx(losses, rel=1e-5)
