"""``--balance-micro-batches`` (data/vision/micro_batch_balance.py, tasks/llava/data.py): each global
batch's samples are spread over DP ranks x micro-batches so the loads (text tokens + vision patches) even out,
while every global batch keeps exactly its samples (the gradient and the data position do not change) and every
rank computes the same assignment."""

from __future__ import annotations

import argparse
import random

import pytest
import torch

from mtmegatron.data.vision.micro_batch_balance import balance, contiguous, peak_to_mean
from mtmegatron.data.position import SamplePlan
from mtmegatron.data.section import Batches
from mtmegatron.tasks.llava.data import MicroBatches, Split, balance_summary
from mtmegatron.tasks.section import VisionReading


@pytest.mark.parametrize("dp,mbs,micro", [(1, 2, 4), (2, 1, 4), (2, 2, 2), (4, 1, 8), (2, 4, 3)])
def test_every_sample_once_and_never_worse(dp, mbs, micro):
    rng = random.Random(dp * 100 + mbs * 10 + micro)
    for _ in range(20):
        n = dp * mbs * micro
        loads = [rng.choice([40, 60, 300, 1200, 4000]) + rng.randrange(20) for _ in range(n)]
        assignment = balance(loads, dp, mbs)
        assert len(assignment) == dp and all(len(rank) == micro for rank in assignment)
        assert all(len(m) == mbs for rank in assignment for m in rank)
        assert sorted(p for rank in assignment for m in rank for p in m) == list(range(n))
        before, after = peak_to_mean(loads, contiguous(n, dp, mbs)), peak_to_mean(loads, balance(loads, dp, mbs))
        assert after[0] <= before[0] + 1e-9 or mbs == 1  # one sample per micro-batch: nothing to regroup
        assert after[1] <= before[1] * 1.25  # greedy: never far off the contiguous slices, mostly better
        assert balance(loads, dp, mbs) == assignment  # deterministic: every rank computes the same


def test_a_skewed_batch_evens_out():
    loads = [4000, 4000, 50, 50, 50, 50, 50, 50]  # two pages first, then icons: contiguous slices pile them up
    before, after = peak_to_mean(loads, contiguous(8, 2, 2)), peak_to_mean(loads, balance(loads, 2, 2))
    assert before == pytest.approx((8000 / (8300 / 4), 8100 / 4150))
    assert after == pytest.approx((4050 / (8300 / 4), 1.0))  # one page per rank, one per micro-batch


def test_a_global_batch_that_does_not_fill_the_bins_is_refused():
    with pytest.raises(ValueError, match="do not fill 2 ranks"):
        balance([1, 2, 3], 2, 1)


class _Samples(torch.utils.data.Dataset):
    def __init__(self, loads):
        self.loads = loads

    def __len__(self):
        return len(self.loads)

    def __getitem__(self, i):
        return i


def _args(balanced: bool, dp: int = 2) -> argparse.Namespace:
    return argparse.Namespace(global_batch_size=8, micro_batch_size=2, data_parallel_size=dp, seed=3,
                              balance_micro_batches=balanced, rampup_batch_size=None, iterations_to_skip=None)


def test_the_ranks_read_each_global_batch_exactly_once():
    loads = [random.Random(i).choice([30, 500, 3000]) for i in range(24)]
    dataset = torch.utils.data.Subset(_Samples(loads + [1] * 8), list(range(24)))  # the held-out cut's Subset
    per_iteration = {}
    for balanced in (False, True):
        args = _args(balanced)
        plan = SamplePlan(Batches.of(args), args.data_parallel_size)
        ranks = [MicroBatches(dataset, list, VisionReading.of(args), r, plan, shuffle=True) for r in (0, 1)]
        for iteration in range(6):  # past an epoch: the next permutation
            read = [next(reader) + next(reader) for reader in ranks]  # 2 micro-batches of 2 per rank
            per_iteration.setdefault(iteration, []).append(sorted(read[0] + read[1]))
            if balanced:
                micro = [sum(loads[i] for i in m) for m in (read[0][:2], read[0][2:], read[1][:2], read[1][2:])]
                assert max(micro) <= 2 * sum(micro) / 4 + 3000  # never more than one heavy sample above the mean
    for iteration, (plain, balanced) in per_iteration.items():
        assert plain == balanced, iteration  # the same samples per global batch, so the same gradient


def test_the_start_up_line_reports_before_and_after():
    loads = [4000, 4000, 4000, 50, 50, 50, 50, 50] * 4
    args = _args(True)
    plan = SamplePlan(Batches.of(args), args.data_parallel_size)
    line = balance_summary(Split(_Samples(loads), list, shuffle=False), VisionReading.of(args), plan, batches=3)
    assert line.startswith("micro-batches balanced by load (text tokens + vision patches), mean over the first 3 ")
    per_micro = line.split("per micro-batch ")[1].split(",")[0]
    before, after = (float(x) for x in per_micro.split(" -> "))
    assert before == pytest.approx(8000 / (12250 / 4), abs=0.01) and after == pytest.approx(4050 / (12250 / 4), abs=0.01)


def test_the_flag_is_refused_where_there_is_nothing_to_balance():
    from mtmegatron.convert.model import parse_flags
    from mtmegatron.utils.errors import ConfigError

    with pytest.raises(ConfigError, match="--balance-micro-batches: only the native-resolution vision-language"):
        parse_flags(["--model", "llama3", "--balance-micro-batches"])
    with pytest.raises(ConfigError, match="balances image/video conversations: give --data-path"):  # a CHECKS entry
        parse_flags(["--model", "qwen2-vl", "--model-size", "tiny", "--balance-micro-batches"])  # mock data
