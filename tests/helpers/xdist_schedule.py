"""The order in which pytest-xdist hands the suite's groups to workers: longest first, from recorded durations.

Under ``--dist loadgroup`` pytest-xdist hands out its work units (a group of tests sharing a fixture, or one test)
in order of their number of tests. A unit's cost is what matters for two workers finishing together: a 2-minute
module fixture handed out last leaves the other worker idle for 2 minutes. ``LongestFirstGroups`` hands out the
costliest waiting unit each time a worker asks for work (longest processing time first), estimating a test's cost
from ``tests/durations.json``: seconds per test file, recorded by a whole run
(``MTMEGATRON_RECORD_DURATIONS=tests/durations.json bash scripts/test.sh``), divided evenly among the file's tests;
a file not recorded counts as ``UNKNOWN_S`` per test. Without the file, pytest-xdist's own order.

``DurationLog`` (on the controller) prints each worker's busy seconds and when its last test ended, so a run shows
how evenly the workers were loaded, and writes the recording when asked.

May assume: pytest-xdist >= 3.5 (its LoadGroupScheduling and the ``@group`` node-id suffix).
"""

from __future__ import annotations

import collections
import json
import os
import time

import pytest

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DURATIONS = os.path.join(TESTS, "durations.json")
DURATIONS_ENV = "MTMEGATRON_DURATIONS"  # another recording to read (tests/test_xdist_grouping.py)
RECORD_ENV = "MTMEGATRON_RECORD_DURATIONS"
UNKNOWN_S = 2.0


def _file_of(nodeid: str) -> str:
    return nodeid.split("@", 1)[0].split("::", 1)[0]


def load_costs(path: str | None = None) -> dict[str, float]:
    """``{test file (rootdir-relative): seconds}`` as recorded, or {} without a recording."""
    path = path or os.environ.get(DURATIONS_ENV) or DURATIONS
    try:
        with open(path) as f:
            return {name: float(entry["seconds"]) for name, entry in json.load(f)["files"].items()}
    except FileNotFoundError:
        return {}


def longest_first_scheduler(config, log, costs: dict[str, float]):
    from xdist.scheduler import LoadGroupScheduling

    class LongestFirstGroups(LoadGroupScheduling):
        def _unit_cost(self, scope: str) -> float:
            cached = self._costs_by_scope.get(scope)
            if cached is None:
                per_test = self._per_test
                cached = sum(per_test.get(_file_of(n), UNKNOWN_S) for n in self.workqueue[scope])
                self._costs_by_scope[scope] = cached
            return cached

        def _assign_work_unit(self, node) -> None:
            if not hasattr(self, "_per_test"):
                counts = collections.Counter(_file_of(n) for n in self.collection)
                self._per_test = {f: costs[f] / counts[f] for f in counts if f in costs}
                self._costs_by_scope = {}
            scope = max(self.workqueue, key=self._unit_cost)
            self.workqueue.move_to_end(scope, last=False)
            super()._assign_work_unit(node)

    return LongestFirstGroups(config, log)


class DurationLog:
    """Controller-side: per-worker load, and the recording of per-file seconds when ``RECORD_ENV`` names a file."""

    def __init__(self):
        self.start = time.monotonic()
        self.busy = collections.Counter()
        self.last_end: dict[str, float] = {}
        self.files = collections.Counter()
        self.tests = collections.Counter()
        self.order = "pytest-xdist's"

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_make_scheduler(self, config, log):
        costs = load_costs()
        if config.getvalue("dist") != "loadgroup" or not costs:
            return None
        self.order = f"longest first ({len(costs)} recorded files)"
        return longest_first_scheduler(config, log, costs)

    def pytest_runtest_logreport(self, report):
        worker = getattr(getattr(report, "node", None), "gateway", None)
        if worker is None:
            return
        self.busy[worker.id] += report.duration
        self.last_end[worker.id] = time.monotonic() - self.start
        name = _file_of(report.nodeid)
        self.files[name] += report.duration
        if report.when == "call" or (report.when == "setup" and report.skipped):
            self.tests[name] += 1

    def pytest_terminal_summary(self, terminalreporter):
        if not self.busy:
            return
        terminalreporter.write_line(f"xdist workers ({self.order} order): " + "; ".join(
            f"{w} busy {self.busy[w]:.0f} s, last test ended at {self.last_end[w]:.0f} s" for w in sorted(self.busy)))
        path = os.environ.get(RECORD_ENV)
        if path:
            with open(path, "w") as f:  # one line per file, so a re-recording diffs by file
                f.write(f'{{"recorded_by": "{RECORD_ENV}=... bash scripts/test.sh (tests/helpers/xdist_schedule.py)",\n'
                        '"files": {\n')
                f.write(",\n".join(f'{json.dumps(n)}: {{"seconds": {s:.1f}, "tests": {self.tests[n]}}}'
                                    for n, s in sorted(self.files.items())))
                f.write("\n}}\n")
            terminalreporter.write_line(f"per-file durations written to {path}")
