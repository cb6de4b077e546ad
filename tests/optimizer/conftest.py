"""Pretrain runs shared by the optimizer tests: each distinct command runs once per pytest session.

``offload_runs(name, nproc, args, env=None, backend_env=None) -> Run``: runs ``mtmegatron.pretrain`` on ``nproc``
ranks with ``MTMEGATRON_OPTIMIZER_STATS`` set (offload_stats of every rank after each step) the first time
``name`` is asked for, and returns the cached result afterwards. A name must always be asked for with the same
command (checked), so two tests never read different runs under one name. ``offload_runs.root`` is the session
directory (checkpoints that several tests read go there).
May assume: the helpers in tests/helpers; the runs are deterministic (same command, same losses).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from helpers.pretrain_runner import run_pretrain


@dataclasses.dataclass
class Run:
    stdout: str
    rows: list
    stats_dir: Path

    @property
    def losses(self) -> list:
        return [r["loss"] for r in self.rows]

    def stats(self, rank: int = 0) -> dict:
        return json.loads((self.stats_dir / f"rank{rank}.json").read_text())


@pytest.fixture(scope="session")
def offload_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("optimizer_runs")
    cache: dict[str, tuple[tuple, Run]] = {}

    def get(name: str, nproc: int, args: list[str], env: dict | None = None, timeout: int = 400) -> Run:
        key = (nproc, tuple(args), tuple(sorted((env or {}).items())))
        if name in cache:
            assert cache[name][0] == key, f"run {name!r} asked for with two different commands"
            return cache[name][1]
        stats = root / name / "stats"
        proc, rows = run_pretrain(nproc, args, root / name, timeout=timeout,
                                  env={**(env or {}), "MTMEGATRON_OPTIMIZER_STATS": str(stats)})
        cache[name] = (key, Run(proc.stdout, rows, stats))
        return cache[name][1]

    get.root = root
    return get
