"""The README's main command (`torchrun --nproc_per_node 2 -m mtmegatron.pretrain`, no data flags), shortened:
it preprocesses the embedded corpus on first use, trains the tiny Llama-3 on it with validation, and leaves
metrics.jsonl, tensorboard events, a loss-curve PNG and greedy samples; the validation loss falls. Its start-up
is quiet: megatron-core's rerun-machine notices and the inference engine's progress bar appear once, not per rank."""

from __future__ import annotations

import math
import re
from pathlib import Path

from helpers.pretrain_runner import run_pretrain
from helpers.real_data import use_corpus_cache


def test_main_command_learns_and_leaves_its_outputs(tmp_path):
    cache = use_corpus_cache()
    # the main command plus: fewer iterations, a higher LR so 40 iterations show learning, TP2+SP so
    # sampling's sequence-parallel padding is exercised
    args = ["--backend", "cpu", "--train-iters", "40", "--lr", "3e-3", "--lr-warmup-iters", "4",
            "--eval-interval", "20", "--eval-iters", "2", "--log-interval", "10",
            "--tensor-model-parallel-size", "2", "--sequence-parallel", "--sample-tokens", "12"]
    proc, rows = run_pretrain(2, args, tmp_path / "run", timeout=600)
    assert [r["iteration"] for r in rows] == list(range(1, 41))
    assert abs(rows[0]["loss"] - math.log(1024)) < 0.3  # starts at chance over the 1024-token BPE
    val = {r["iteration"]: r["val_loss"] for r in rows if "val_loss" in r}
    assert sorted(val) == [20, 40]
    assert val[40] < val[20] - 0.1 and val[20] < math.log(1024) - 1.0, val
    assert rows[-1]["loss"] < rows[0]["loss"] - 1.5
    events = list((tmp_path / "run" / "tensorboard").glob("events.out.tfevents.*"))
    assert events and events[0].stat().st_size > 1000
    assert (tmp_path / "run" / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    samples = (tmp_path / "run" / "samples.txt").read_text()
    assert samples.count("--- prompt:") == 3 and "In the beginning" in samples
    assert "greedy samples" in proc.stdout and "And the LORD said unto Moses," in proc.stdout
    assert (Path(cache) / "kjv-v1-bpe1024" / "complete").is_file()  # preprocessed once, for later runs
    output = proc.stdout + proc.stderr
    for notice in ("RerunStateMachine initialized in mode", "Result validation enabled"):
        assert output.count(notice) <= 1, (notice, proc.stderr[-3000:])
    bars = re.findall(r"static requests:\s+0%", output)  # each bar starts once at 0%
    assert len(bars) == 1, proc.stderr[-3000:]  # rank 0's bar only, of the 2 ranks
