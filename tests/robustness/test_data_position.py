"""The data position is the consumed-sample count (data/position.py), as in Megatron-LM.

Which samples each run trained is read from the test hook ``MTMEGATRON_TEST_TRAINED_SAMPLES`` (training/data.py:
one line per micro-batch handed to the model); what a checkpoint records is read from its ``args`` Namespace.
* A 4-iteration run at global batch 8 (saves every 2) resumed with ``--global-batch-size 4 --train-iters 8``
  trains samples 32-47 (not 16-31 again) and records 48 consumed; resumed with ``--global-batch-size 16
  --train-samples 96`` and ``--override-opt_param-scheduler`` it trains 32-95 (none skipped: iterations 5-8, the
  samples left after the checkpoint's, not 96 // 16 = 6 iterations in all) and records 96. Together with the first run
  each covers ``[0, consumed)`` exactly once, as the uninterrupted run does. Validation's consumed samples go on
  from the checkpoint's (eval_iters x global batch per evaluation).
* ``--rampup-batch-size 2 2 16 --train-samples 60`` with ``--iterations-to-skip 1 4``: the iteration count,
  each iteration's samples and micro-batch count, the LR warmup in trained samples and the recorded consumed
  and skipped samples are those of Megatron-LM's rules, written out below (not read from mtmegatron), and a
  checkpoint is saved before each change of the micro-batch count, as Megatron-LM saves.
* ``--result-rejected-tracker-filename`` adds the rerun machine's reproducibly rejected iterations to the skips.
"""

from __future__ import annotations

import json
import math
from collections import Counter, defaultdict
from pathlib import Path

import pytest
from helpers.pretrain_runner import TINY, run_pretrain

TRAINED_ENV = "MTMEGATRON_TEST_TRAINED_SAMPLES"
LR = 3e-3


def _run(tmp: Path, name: str, flags: list[str]):
    record = tmp / f"{name}-samples"
    record.mkdir()
    _, rows = run_pretrain(1, TINY + flags, tmp / name, env={TRAINED_ENV: str(record)})
    batches = defaultdict(list)  # iteration -> its micro-batches' sample lists
    for line in (record / "rank0.jsonl").read_text().splitlines():
        entry = json.loads(line)
        batches[entry["iteration"]].append(entry["samples"])
    return rows, dict(batches)


def _position(ckpt: Path, iteration: int) -> dict:
    from megatron.core import dist_checkpointing

    ns = dist_checkpointing.load_common_state_dict(str(ckpt / f"iter_{iteration:07d}"))["args"]
    return {k: getattr(ns, k) for k in ("consumed_train_samples", "skipped_train_samples", "consumed_valid_samples")}


def _samples(batches: dict) -> list[int]:
    return [i for micro in batches.values() for samples in micro for i in samples]


@pytest.fixture(scope="module")
def first(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("position")
    ckpt = tmp / "ckpt"
    rows, batches = _run(tmp, "first", ["--train-iters", "4", "--save", str(ckpt), "--save-interval", "2",
                                        "--eval-interval", "2", "--eval-iters", "1"])
    return tmp, ckpt, rows, batches


def test_first_run_reads_consecutive_global_batches(first):
    _, ckpt, rows, batches = first
    assert [r["iteration"] for r in rows] == [1, 2, 3, 4]
    assert {it: sorted(i for m in micro for i in m) for it, micro in batches.items()} == {
        it: list(range((it - 1) * 8, it * 8)) for it in (1, 2, 3, 4)}
    assert _position(ckpt, 2) == {"consumed_train_samples": 16, "skipped_train_samples": 0,
                                  "consumed_valid_samples": 8}
    assert _position(ckpt, 4) == {"consumed_train_samples": 32, "skipped_train_samples": 0,
                                  "consumed_valid_samples": 16}


@pytest.mark.parametrize("gbs, consumed", [(4, 48), (16, 96)])
def test_resume_with_another_global_batch_continues_at_the_consumed_samples(first, gbs, consumed):
    tmp, ckpt, _, first_batches = first
    name = f"gbs{gbs}"
    # the larger batch counts in samples: 96 in all, so 4 more iterations of 16 after the checkpoint's 32
    length = ["--train-iters", "8"] if gbs < 8 else ["--train-samples", "96"]
    flags = ["--global-batch-size", str(gbs), *length, "--load", str(ckpt),
             "--save", str(tmp / f"{name}-ckpt"), "--eval-interval", "2", "--eval-iters", "1"]
    if gbs > 8:  # the LR decay length (in samples) changes: Megatron-LM asks for a choice
        flags.append("--override-opt_param-scheduler")
    rows, batches = _run(tmp, name, flags)
    assert [r["iteration"] for r in rows] == [5, 6, 7, 8]
    for it, micro in batches.items():  # iteration 5 starts at the checkpoint's 32 consumed samples
        assert sorted(i for m in micro for i in m) == list(range(32 + (it - 5) * gbs, 32 + (it - 4) * gbs))
    trained = Counter(_samples(first_batches) + _samples(batches))
    assert sorted(trained) == list(range(consumed)) and set(trained.values()) == {1}  # no repeat, no gap
    # validation: 2 evaluations of 1 x 8 before the checkpoint, 2 of 1 x gbs after it
    assert _position(tmp / f"{name}-ckpt", 8) == {"consumed_train_samples": consumed, "skipped_train_samples": 0,
                                                  "consumed_valid_samples": 16 + 2 * gbs}


def _megatron_rampup(start: int, increment: int, ramp_samples: int, gbs: int, consumed: int) -> int:
    """Megatron-LM's global batch size after ``consumed`` samples (RampupBatchsizeNumMicroBatchesCalculator)."""
    if consumed > ramp_samples:
        return gbs
    return start + int(consumed / (ramp_samples / ((gbs - start) // increment))) * increment


def _megatron_train_iters(start, increment, ramp_samples, gbs, train_samples) -> int:
    """Megatron-LM's update_train_iters under a ramp-up."""
    iterations = consumed = 0
    while consumed <= ramp_samples and consumed <= train_samples:
        consumed += _megatron_rampup(start, increment, ramp_samples, gbs, consumed)
        iterations += 1
    return iterations + max(train_samples - consumed, 0) // gbs


def test_rampup_and_iterations_to_skip_follow_megatron_lm(tmp_path):
    ramp, gbs, mbs, train_samples, warmup, skip = (2, 2, 16), 8, 2, 60, 40, (1, 4)
    rows, batches = _run(tmp_path, "rampup", [
        "--train-samples", str(train_samples), "--rampup-batch-size", *map(str, ramp), "--lr-warmup-samples",
        str(warmup), "--iterations-to-skip", *map(str, skip), "--save", str(tmp_path / "ckpt")])
    iterations = _megatron_train_iters(*ramp, gbs, train_samples)
    assert iterations == 11
    expected, lrs, consumed, trained, skipped = {}, {}, 0, 0, 0
    for done in range(iterations):  # Megatron-LM's loop: `done` iterations finished before this one
        size = _megatron_rampup(*ramp, gbs, consumed)
        if done in skip:  # consumed, not trained, the LR schedule does not move
            skipped += size
        else:
            expected[done + 1] = [list(range(first, first + mbs)) for first in range(consumed, consumed + size, mbs)]
            lrs[done + 1] = LR * min(trained / warmup, 1.0)
            trained += size
        consumed += size
    assert consumed == 60 and skipped == 2 + 4
    assert batches == expected  # samples and micro-batch counts (1, 1, 2, 3, then 4) per iteration
    assert [r["iteration"] for r in rows] == list(expected)
    for row in rows:
        assert math.isclose(row["lr"], lrs[row["iteration"]], rel_tol=1e-9, abs_tol=1e-12), row
    # Megatron-LM saves before an iteration whose micro-batch count differs (1 -> 2 -> 3 -> 4), and at the end
    saved = sorted(int(d.name[len("iter_"):]) for d in (tmp_path / "ckpt").glob("iter_*"))
    assert saved == [3, 5, 6, iterations]
    for it, (consumed, skipped) in {3: (6, 2), 5: (14, 6), 6: (20, 6), iterations: (60, 6)}.items():
        assert _position(tmp_path / "ckpt", it) == {"consumed_train_samples": consumed,
                                                    "skipped_train_samples": skipped, "consumed_valid_samples": 0}


def test_rejected_results_tracker_adds_iterations_to_skip(tmp_path):
    """--result-rejected-tracker-filename: as Megatron-LM, the iterations megatron-core's rerun machine logged
    as reproducibly rejected twice on one rank are appended to --iterations-to-skip."""
    from mtmegatron.config.arguments import parse_args

    tracker = tmp_path / "rejected.txt"
    line = "ts=1 node=n device=0 jobID=7 rank=0 iteration={} status=RerunDiagnostic.{} result=1.0 message=m\n"
    tracker.write_text(line.format(6, "FIRST_RERUN_REPRODUCIBLE") * 2 + line.format(9, "FIRST_RERUN_REPRODUCIBLE"))
    args = parse_args(TINY + ["--train-iters", "12", "--iterations-to-skip", "2",
                              "--result-rejected-tracker-filename", str(tracker)])
    assert args.iterations_to_skip == [2, 6]  # 9 was rejected only once
