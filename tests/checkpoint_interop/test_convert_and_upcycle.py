"""Megatron-LM's checkpoint conversion (``--ckpt-convert-format torch_dist --ckpt-convert-save DIR``): a tiny
mock-data run saved at iteration 2 is loaded and written to ``DIR/torch_dist`` at the same iteration with the same
tensors (read back in this process with torch.distributed.checkpoint, no process group), the run exits 0 without
training and prints Megatron-LM's line, and a run resumed from the converted copy continues at iteration 3 with the
loss of one resumed from the original. The conversion's user mistakes are checked at parse time.
May assume: the cpu backend; the module fixture's runs are shared by the tests here."""

from __future__ import annotations

import math

import pytest
import torch
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from helpers.pretrain_runner import TINY, run_pretrain
from mtmegatron.training.arguments import parse_args
from mtmegatron.training.errors import ConfigError

DECAY = ["--lr-decay-iters", "3"]  # one schedule for the 2-iteration save and the 3-iteration resumes
BASE = TINY + DECAY + ["--train-iters", "2"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("convert")
    original, converted = tmp / "original", tmp / "converted"
    run_pretrain(1, BASE + ["--save", str(original)], tmp / "train")
    convert, rows = run_pretrain(1, BASE + ["--load", str(original), "--ckpt-convert-format", "torch_dist",
                                            "--ckpt-convert-save", str(converted)], tmp / "convert")
    resumed = {}
    for name, root in (("original", original), ("converted", converted / "torch_dist")):
        resumed[name] = run_pretrain(1, TINY + DECAY + ["--train-iters", "3", "--load", str(root)], tmp / f"resume_{name}")[1]
    return {"tmp": tmp, "original": original, "converted": converted, "convert": convert, "convert_rows": rows,
            "resumed": resumed}


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

    original, converted = runs["resumed"]["original"], runs["resumed"]["converted"]
    assert [r["iteration"] for r in converted] == [3] == [r["iteration"] for r in original]
    assert math.isclose(converted[0]["loss"], original[0]["loss"], rel_tol=0, abs_tol=0)


@pytest.mark.parametrize("flags, message", [
    (["--ckpt-convert-format", "torch", "--ckpt-convert-save", "x", "--load", "y"],
     "--ckpt-convert-format torch: mtmegatron does not write torch checkpoints"),
    (["--ckpt-convert-format", "torch_dist", "--load", "y"], "--ckpt-convert-format needs --ckpt-convert-save DIR"),
    (["--ckpt-convert-format", "torch_dist", "--ckpt-convert-save", "x"], "--ckpt-convert-format needs --load DIR"),
    (["--ckpt-convert-update-legacy-dist-opt-format"], "--ckpt-convert-update-legacy-dist-opt-format: it rewrites"),
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
