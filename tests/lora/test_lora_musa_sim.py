"""A LoRA run on the simulated MUSA device (tests/musa_sim; one rank, fp32, the lane's tiny Llama): the frozen base
is on the device with everything else (the placement line), the start-up line counts the adapters, and the
optimizer holds state for the adapters only: its parameters are exactly the trainable ones, its state bytes (on
musa:0, read through the MTMEGATRON_OPTIMIZER_STATS hook) are Adam's two fp32 moments of those elements and nothing
for the base. The losses fall."""

from __future__ import annotations

import json
import re

import pytest

from helpers.musa_sim import sim_env
from helpers.pretrain_runner import TINY, run_pretrain

pytestmark = pytest.mark.musa_sim

ITERS = 4


def test_lora_on_the_device_keeps_no_optimizer_state_for_the_base(tmp_path):
    args = [a for a in TINY if a not in ("--backend", "cpu")] + [
        "--backend", "musa", "--train-iters", str(ITERS), "--use-cpu-initialization", "--transformer-impl", "local",
        "--lora-r", "8", "--lora-alpha", "16", "--log-interval", "1"]
    stats = tmp_path / "stats"
    proc, rows = run_pretrain(1, args, tmp_path / "log", env=sim_env({"MTMEGATRON_OPTIMIZER_STATS": str(stats)}))
    assert "placement: all" in proc.stdout and "on musa:0" in proc.stdout, proc.stdout[-2000:]
    line = re.search(r"mtmegatron: LoRA r 8 .*\| trainable ([\d,]+) of ([\d,]+) parameters", proc.stdout)
    assert line, proc.stdout[-2000:]
    trainable, total = (int(g.replace(",", "")) for g in line.groups())
    # 4 layers x (qkv 3*8*64 + 128*8, proj 8*64 + 64*8, fc1 2*8*64 + 256*8, fc2 8*128 + 64*8) = 32,768; the base:
    # embedding and head 2 x 256*64, 4 layers x (8192 + 4096 + 16384 + 8192 + 2*64 norms), final norm 64 = 180,800
    assert (trainable, total) == (32768, 180800 + 32768), line.group(0)
    state = json.loads((stats / "rank0.json").read_text())
    assert state["total_params"] == trainable, state
    assert state["state_bytes_by_device"]["device"] == {"musa:0": 2 * 4 * trainable}, state
    assert state["misplaced_state_bytes"] == 0 and not state["state_bytes_by_device"]["host"], state
    losses = [r["loss"] for r in rows if "loss" in r]
    assert len(losses) == ITERS and losses[-1] < losses[0], losses
