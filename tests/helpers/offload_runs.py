"""Pretrain runs shared by the optimizer tests (tests/optimizer): each distinct command runs once per pytest session.

``OffloadRuns(root)``, the ``offload_runs`` fixture: ``offload_runs(name, nproc, args, env=None) -> Run`` runs
``mtmegatron.pretrain`` on ``nproc`` ranks with ``MTMEGATRON_OPTIMIZER_STATS`` set (offload_stats of every rank after
each step) the first time ``name`` is asked for, and returns the cached result afterwards. A name must always be asked
for with the same command (checked), so two tests never read different runs under one name. ``offload_runs.root`` is
the session directory (checkpoints that several tests read go there).
``BASE``, ``OFFLOAD``, ``dp2_offload``: the commands test_offload.py and test_offload_musa_sim.py share.
May assume: the runs are deterministic (same command, same losses).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from helpers.pretrain_runner import TINY, run_pretrain

ITERS = 10
RESUME_AT = 5
BASE = TINY + ["--train-iters", str(ITERS), "--use-distributed-optimizer"]
OFFLOAD = ["--use-precision-aware-optimizer", "--optimizer-cpu-offload", "--optimizer-offload-fraction"]


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


class OffloadRuns:
    def __init__(self, root: Path):
        self.root = root
        self._cache: dict[str, tuple[tuple, Run]] = {}

    def __call__(self, name: str, nproc: int, args: list[str], env: dict | None = None, timeout: int = 400) -> Run:
        key = (nproc, tuple(args), tuple(sorted((env or {}).items())))
        if name in self._cache:
            assert self._cache[name][0] == key, f"run {name!r} asked for with two different commands"
            return self._cache[name][1]
        stats = self.root / name / "stats"
        proc, rows = run_pretrain(nproc, args, self.root / name, timeout=timeout,
                                  env={**(env or {}), "MTMEGATRON_OPTIMIZER_STATS": str(stats)})
        self._cache[name] = (key, Run(proc.stdout, rows, stats))
        return self._cache[name][1]


def dp2_offload(runs, fraction, bf16=False):
    """The offloaded DP2 run; fraction 0.5 saves at 5 (the resume test loads it), which must not change it."""
    name = f"dp2_off{fraction}" + ("_bf16" if bf16 else "")
    args = BASE + OFFLOAD + [fraction] + (["--bf16"] if bf16 else [])
    if fraction == "0.5":
        args += ["--save", str(runs.root / f"ck_{name}"), "--save-interval", str(RESUME_AT)]
    return runs(name, 2, args)
