"""Faults a long run meets: inf/nan in the gradients, a checkpoint of another model, a damaged checkpoint,
corrupt data. None of them may corrupt or hide anything: a skipped step leaves the weights alone, and
user-facing problems are one clear message. (A rank killed (-9) inside a persistent or non-persistent save, and
a full disk: tests/robustness/test_checkpoint_kill.py; SIGTERM: tests/robustness/test_signals_torchrun.py.)"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import torch

from helpers.launch import finish, launch, rows
from helpers.pretrain_runner import TINY, run_pretrain
from mtmegatron.utils.checkpoint_dirs import complete_iterations

DP2 = TINY + ["--use-distributed-optimizer"]


def _tensors(directory: Path, tmp: Path) -> dict:
    """Every tensor of a dist_checkpointing checkpoint (torch_dist format), read without process groups."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    out = tmp / f"{directory.name}.pt"
    dcp_to_torch_save(str(directory), str(out))
    return {k: v for k, v in torch.load(out, weights_only=False).items() if torch.is_tensor(v)}


def test_nan_gradients_skip_the_step_and_stop_after_max_skipped(tmp_path):
    ckpt = tmp_path / "ckpt"
    args = DP2 + ["--train-iters", "8", "--lr-decay-style", "cosine", "--save", str(ckpt), "--save-interval", "1",
                  "--max-skipped-steps", "2"]
    # nan in rank 1's gradients at iterations 3, 4 and 6: both ranks must skip those steps together
    proc = launch(2, args, tmp_path / "log", {"MTMEGATRON_TEST_INJECT_NAN": "3,4,6:1"})
    out, err = finish(proc, timeout=300)
    assert proc.returncode != 0, "a run stopped by --max-skipped-steps must not look successful"
    assert ("3 steps skipped for inf/nan loss or gradients (more than --max-skipped-steps 2); stopping at "
            "iteration 6") in out, err[-3000:]
    metrics = [json.loads(line) for line in rows(tmp_path / "log")]
    assert [r["iteration"] for r in metrics] == [1, 2, 3, 4, 5, 6]
    assert [r["skipped"] for r in metrics] == [False, False, True, True, False, True]
    assert [r["skipped_steps"] for r in metrics] == [0, 0, 1, 2, 2, 3]
    assert [r["grad_norm"] is None for r in metrics] == [r["skipped"] for r in metrics]
    lrs = [r["lr"] for r in metrics]
    assert lrs[2] == lrs[3] == lrs[4] != lrs[5]  # the LR schedule does not advance on a skipped step
    assert complete_iterations(str(ckpt)) == [1, 2, 3, 4, 5]  # none of the run that gave up at 6
    at = {it: _tensors(ckpt / f"iter_{it:07d}", tmp_path) for it in (2, 4, 5)}
    assert {"decoder.final_layernorm.weight", "optimizer.state.exp_avg.output_layer.weight"} <= at[2].keys()
    changed = [k for k in at[2] if not torch.equal(at[2][k], at[4][k])]
    assert changed == [], f"weights or optimizer state changed by skipped steps: {changed}"
    # iteration 5 was a real step: the comparison does see changes
    assert not torch.equal(at[4]["decoder.final_layernorm.weight"], at[5]["decoder.final_layernorm.weight"])


def test_mismatched_checkpoint_and_corrupt_data_are_clear_errors(tmp_path):
    ckpt = tmp_path / "ckpt"
    run_pretrain(1, TINY + ["--train-iters", "1", "--save", str(ckpt)], tmp_path / "a")
    other = [a if a != "64" else "32" for a in TINY]  # --hidden-size 64 -> 32
    proc, _ = run_pretrain(1, other + ["--train-iters", "2", "--load", str(ckpt)], tmp_path / "b", expect_ok=False)
    assert proc.returncode == 2
    assert "was written for a different model (hidden_size: checkpoint 64 vs run 32" in proc.stderr
    # a checkpoint file damaged on disk: one message naming the checkpoint, not a deep traceback
    shard = next((ckpt / "iter_0000001").glob("*.distcp"))
    shard.write_bytes(shard.read_bytes()[:100])
    proc, _ = run_pretrain(1, TINY + ["--train-iters", "2", "--load", str(ckpt), "--override-opt_param-scheduler"],
                           tmp_path / "c", expect_ok=False)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert f"checkpoint {ckpt / 'iter_0000001'} cannot be loaded" in proc.stderr
    # corrupt index of a real dataset
    prefix = tmp_path / "d_text_document"
    prefix.with_suffix(".idx").write_bytes(b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, 8, 5, 6))
    prefix.with_suffix(".bin").write_bytes(b"")
    real = [a for a in TINY if a != "--mock-data"]
    proc, _ = run_pretrain(1, real + ["--data-path", str(prefix), "--tokenizer-model", str(tmp_path)],
                           tmp_path / "e", expect_ok=False)
    assert proc.returncode == 2
    assert f"{prefix}.idx is truncated" in proc.stderr
