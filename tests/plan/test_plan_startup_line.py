"""The predicted-footprint line every pretrain run prints at start-up (plan/footprint.py, hooked in
pretrain.prepare): one tiny 1-rank CPU run's stdout carries exactly one such line, and its numbers are
``mtmegatron plan``'s rank-0 row for the same command line; a planner failure gives the "unavailable" line instead of
stopping anything. One subprocess run (~5 s CPU, ~8 s wall on 2 shared cores)."""

from __future__ import annotations

import re

import pytest

from helpers.pretrain_runner import TINY, run_pretrain

from mtmegatron.plan.command import plan

ARGV = TINY + ["--train-iters", "1", "--num-workers", "0", "--transformer-impl", "local"]
LINE = re.compile(r"^mtmegatron: predicted footprint \(rank 0, mtmegatron plan; MiB\): weights ([\d.]+) \| gradients "
                  r"([\d.]+) \| optimizer ([\d.]+) \| activations ([\d.]+) \(x(\d+) in flight\) \| buffers ([\d.]+) \| "
                  r"peak ([\d.]+)$", re.M)


@pytest.fixture(scope="module")
def run_stdout(tmp_path_factory):
    proc, rows = run_pretrain(1, ARGV, tmp_path_factory.mktemp("startup"))
    assert len(rows) == 1
    return proc.stdout


def test_startup_line_is_the_planners_rank_0_row(run_stdout, tmp_path):
    found = LINE.findall(run_stdout)
    assert len(found) == 1, run_stdout[-3000:]
    argv = [a for a in ARGV if a not in ("--backend", "cpu")]
    row = plan(["--world-size", "1", *argv, "--log-dir", str(tmp_path)])["ranks"][0]
    mib = [f"{row[k] / 2**20:.1f}" for k in ("weights_bytes", "gradients_bytes", "optimizer_bytes",
                                            "activations_bytes")]
    assert list(found[0][:4]) == mib and found[0][4] == str(row["in_flight_microbatches"])
    assert found[0][5:] == (f"{row['buffers_bytes'] / 2**20:.1f}", f"{row['peak_bytes'] / 2**20:.1f}")
    assert float(found[0][6]) > 0


def test_a_planner_failure_is_one_line_not_an_error(monkeypatch, tmp_path):
    from mtmegatron.config import parse
    from mtmegatron.plan import footprint, params

    def broken(args, stage):
        raise RuntimeError("no meta\nbuild")

    monkeypatch.setattr(params, "stage_params", broken)
    args = parse(ARGV + ["--log-dir", str(tmp_path)], world_size=1).args
    assert footprint.footprint_line(args) == ("mtmegatron: predicted footprint: unavailable "
                                              "(RuntimeError: no meta build)")
