"""Resume with a changed LR schedule (Megatron-LM semantics, training/schedule.py): a checkpoint of a 4-iteration
cosine schedule resumed with ``--train-iters 8`` stops with one message (exit 2, no traceback, under torchrun);
``--override-opt_param-scheduler`` continues on the new 8-iteration cosine, ``--use-checkpoint-opt_param-scheduler``
on the checkpoint's finished one (``--min-lr``); both flags together are refused (at parse time: checked
in-process). The lr values in metrics.jsonl are checked against the schedule formula."""

from __future__ import annotations

import math

import pytest

from helpers.pretrain_runner import TINY, run_pretrain
from mtmegatron.config.arguments import parse_args
from mtmegatron.utils.errors import ConfigError

MAX_LR, MIN_LR = 3e-3, 1e-4
BASE = [a if a != "constant" else "cosine" for a in TINY] + ["--min-lr", str(MIN_LR)]


def cosine(iteration: int, decay_iters: int) -> float:
    """The lr megatron-core's scheduler gives iteration ``iteration`` (1-based; steps counted before it)."""
    done = iteration - 1
    if done > decay_iters:
        return MIN_LR
    return MIN_LR + (MAX_LR - MIN_LR) * 0.5 * (math.cos(math.pi * done / decay_iters) + 1.0)


def test_changed_train_iters_needs_a_choice_and_each_flag_follows_its_schedule(tmp_path):
    ckpt = str(tmp_path / "ckpt")
    _, first = run_pretrain(1, BASE + ["--train-iters", "4", "--save", ckpt], tmp_path / "first")
    assert [r["lr"] for r in first] == [cosine(i, 4) for i in range(1, 5)]  # the formula is the scheduler's

    proc, _ = run_pretrain(2, BASE + ["--train-iters", "8", "--load", ckpt], tmp_path / "refused", expect_ok=False)
    assert proc.returncode == 2, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if "another learning-rate/weight-decay schedule" in line]
    assert len(errors) == 1, proc.stderr[-3000:]
    assert "lr_decay_steps" in errors[0] and "checkpoint 4 iterations vs run 8 iterations" in errors[0]
    assert "--override-opt_param-scheduler" in errors[0] and "--use-checkpoint-opt_param-scheduler" in errors[0]
    assert "Traceback" not in proc.stderr

    _, new = run_pretrain(1, BASE + ["--train-iters", "8", "--load", ckpt, "--override-opt_param-scheduler"],
                          tmp_path / "override")
    assert [r["iteration"] for r in new] == [5, 6, 7, 8]
    for row in new:
        assert math.isclose(row["lr"], cosine(row["iteration"], 8), rel_tol=1e-12), row
    assert min(r["lr"] for r in new) > MIN_LR

    _, kept = run_pretrain(1, BASE + ["--train-iters", "8", "--load", ckpt, "--use-checkpoint-opt_param-scheduler"],
                           tmp_path / "checkpoint")
    assert [r["iteration"] for r in kept] == [5, 6, 7, 8]
    assert [r["lr"] for r in kept] == [MIN_LR] * 4  # the checkpoint's 4-iteration schedule has ended

    # both flags: refused while the flags are parsed (config/schedule_flags.py), so in-process; a ConfigError is
    # pretrain's exit 2 with its one line, as the refused run above shows
    with pytest.raises(ConfigError, match="--override-opt_param-scheduler and --use-checkpoint-opt_param-scheduler "
                                          "are mutually exclusive"):
        parse_args(BASE + ["--train-iters", "8", "--load", ckpt, "--override-opt_param-scheduler",
                           "--use-checkpoint-opt_param-scheduler"])

    # the same schedule (only --train-iters longer, decay fixed) needs no flag
    _, same = run_pretrain(1, BASE + ["--train-iters", "6", "--lr-decay-iters", "4", "--load", ckpt],
                           tmp_path / "same")
    assert [r["lr"] for r in same] == [MIN_LR, MIN_LR]
