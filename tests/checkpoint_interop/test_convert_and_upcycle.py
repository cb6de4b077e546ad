"""Megatron-LM's checkpoint conversion and MoE upcycling on one tiny dense llama run saved at iteration 2.
``--ckpt-convert-format torch_dist --ckpt-convert-save DIR``: the checkpoint is written to ``DIR/torch_dist`` at
the same iteration with the same tensors (read back in this process with torch.distributed.checkpoint, no process
group), the run exits 0 without training and prints Megatron-LM's line, and the copy loads. ``--moe-use-upcycling
--num-experts 4``: the dense checkpoint becomes a 4-expert MoE saved at iteration 1 whose first loss is the dense
model's on the same batch. The user mistakes of both are checked at parse time.
May assume: the cpu backend; the module fixture's runs are shared by the tests here."""

from __future__ import annotations

import math

import pytest
import torch
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from helpers.pretrain_runner import TINY, run_pretrain
from mtmegatron.config.arguments import parse_args
from mtmegatron.utils.errors import ConfigError

DECAY = ["--lr-decay-iters", "3"]  # one schedule for the 2-iteration save and the 3-iteration resumes
BASE = TINY + DECAY + ["--train-iters", "2"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("convert")
    original, converted, moe = tmp / "original", tmp / "converted", tmp / "moe"
    run_pretrain(1, BASE + ["--save", str(original)], tmp / "train")
    convert, rows = run_pretrain(1, BASE + ["--load", str(original), "--ckpt-convert-format", "torch_dist",
                                            "--ckpt-convert-save", str(converted)], tmp / "convert")
    # --finetune: the converted weights on the first batch (iteration 1), as the upcycled run below sees them
    _, from_converted = run_pretrain(1, TINY + DECAY + ["--train-iters", "1", "--finetune", "--load",
                                                        str(converted / "torch_dist")], tmp / "from_converted")
    upcycled, from_upcycled = run_pretrain(1, TINY + DECAY + [
        "--train-iters", "1", "--num-experts", "4", "--moe-router-topk", "2", "--moe-use-upcycling",
        "--load", str(original), "--save", str(moe)], tmp / "upcycled")
    return {"tmp": tmp, "original": original, "converted": converted, "convert": convert, "convert_rows": rows,
            "from_converted": from_converted, "moe": moe, "upcycled": upcycled, "from_upcycled": from_upcycled}


def _tensors(directory, out):
    dcp_to_torch_save(str(directory), str(out))
    return torch.load(out, weights_only=False)


def test_convert_writes_the_loaded_checkpoint_and_exits(runs):
    proc = runs["convert"]
    assert proc.returncode == 0 and runs["convert_rows"] == []  # no training step
    assert "> converted checkpoint: torch_dist -> torch_dist." in proc.stdout
    target = runs["converted"] / "torch_dist"
    assert (target / "latest_checkpointed_iteration.txt").read_text() == "2"
    before = _tensors(runs["original"] / "iter_0000002", runs["tmp"] / "before.pt")
    after = _tensors(target / "iter_0000002", runs["tmp"] / "after.pt")
    weights = [k for k, v in before.items() if isinstance(v, torch.Tensor) and "optimizer" not in k]
    assert any("decoder.layers" in k for k in weights) and set(weights) <= set(after)
    for key in weights:
        assert torch.equal(before[key], after[key]), key
    optim = [k for k, v in before.items() if isinstance(v, torch.Tensor) and "optimizer" in k]
    assert optim and all(torch.equal(before[k], after[k]) for k in optim)  # Adam's moments too

    assert [r["iteration"] for r in runs["from_converted"]] == [1]  # the converted copy loads


def test_upcycled_moe_computes_the_dense_model(runs):
    """megatron-core's upcycling with granularity 1 copies the dense MLP into each of the 4 experts unscaled, and
    the router's top-2 softmax (after the top-k selection, --moe-router-pre-softmax off: Megatron-LM's default)
    gives weights summing to 1, so the MoE's first loss is the dense model's on the same batch."""
    proc = runs["upcycled"]
    assert "--no-load-optim and --no-load-rng forced" in proc.stdout
    assert f"Upcycled checkpoint saved to {runs['moe']}" in proc.stdout
    assert (runs["moe"] / "iter_0000001").is_dir()
    dense, moe = runs["from_converted"], runs["from_upcycled"]
    assert [r["iteration"] for r in moe] == [1]
    assert math.isclose(moe[0]["loss"], dense[0]["loss"], rel_tol=1e-5), (moe[0]["loss"], dense[0]["loss"])
    saved = _tensors(runs["moe"] / "iter_0000001", runs["tmp"] / "moe.pt")  # rewritten after the step
    assert saved["decoder.layers.mlp.experts.experts.linear_fc1.weight"].shape == (4, 4, 256, 64)  # layers, experts
    assert saved["decoder.layers.mlp.router.weight"].shape == (4, 4, 64)


@pytest.mark.parametrize("flags, message", [
    (["--ckpt-convert-format", "torch", "--ckpt-convert-save", "x", "--load", "y"],
     "--ckpt-convert-format torch: mtmegatron does not write torch checkpoints"),
    (["--ckpt-convert-format", "torch_dist", "--load", "y"], "--ckpt-convert-format needs --ckpt-convert-save DIR"),
    (["--ckpt-convert-format", "torch_dist", "--ckpt-convert-save", "x"], "--ckpt-convert-format needs --load DIR"),
    (["--ckpt-convert-update-legacy-dist-opt-format"], "--ckpt-convert-update-legacy-dist-opt-format: it rewrites"),
    (["--moe-use-upcycling", "--num-experts", "4", "--load", "y"], "--moe-use-upcycling needs --save DIR"),
    (["--moe-use-upcycling", "--save", "x", "--load", "y"], "--moe-use-upcycling needs --num-experts"),
])
def test_convert_mistakes_are_one_line(flags, message, tmp_path):
    with pytest.raises(ConfigError, match=message):
        parse_args(["--backend", "cpu", "--model", "llama3", "--mock-data"] + flags, world_size=1)


def test_convert_of_an_empty_load_is_refused(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="no complete checkpoint.*--exit-on-missing-checkpoint"):
        parse_args(["--backend", "cpu", "--model", "llama3", "--mock-data", "--load", str(tmp_path / "empty"),
                    "--ckpt-convert-format", "torch_dist", "--ckpt-convert-save", str(tmp_path / "out")],
                   world_size=1)


def test_upcycling_into_a_save_with_a_checkpoint_is_refused(runs):
    with pytest.raises(ConfigError, match="--moe-use-upcycling: --save .* already holds a checkpoint \\(iteration 2\\)"):
        parse_args(["--backend", "cpu", "--model", "llama3", "--mock-data", "--moe-use-upcycling", "--num-experts",
                    "4", "--load", str(runs["original"]), "--save", str(runs["original"])], world_size=1)
