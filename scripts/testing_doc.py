"""Writes docs/testing.md: how to run the test suite, and its size as collected now.

The counts are never written by hand: this script collects the suite (``pytest --collect-only -q``, in this
process, with a small plugin that records each test's markers) and counts the tests per directory of tests/, the
ones CI runs (``-m "not gpu"``), the GPU-marked ones (run by scripts/gpu_conformance.sh) and the simulated-MUSA
lane (``-m musa_sim``). Where a whole run was recorded (``MTMEGATRON_RECORD_DURATIONS=tests/durations.json bash
scripts/test.sh``: per test file its seconds and test count) it adds the recorded seconds per directory; without that file it says so.

Usage: ``python scripts/testing_doc.py [--out docs/testing.md]``.
May assume: run from anywhere inside the repository with the test dependencies installed (pytest, the package).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DURATIONS = os.path.join(ROOT, "tests", "durations.json")

HOW = """\
# Testing

Written by `python scripts/testing_doc.py` (the counts below are collected, not typed: rerun it after adding
tests).

## The command

CI runs `.ci/run`, which runs the README's test command:

```bash
bash scripts/test.sh
```

It installs first (`scripts/install.sh`), then runs every CPU test, the simulated-MUSA lane included, on two
pytest-xdist workers (`MTMEGATRON_TEST_WORKERS=N`, 0 for one process; extra arguments go to pytest). Tests that
share a module fixture stay on one worker, so the fixture runs once, on every pytest a fresh install gets
(tests/helpers/xdist_groups.py; tests/test_xdist_grouping.py counts the set-ups); with a recorded
`tests/durations.json` the costliest group is handed out first (tests/helpers/xdist_schedule.py). The run ends
with each worker's busy time, and `scripts/test.sh` prints the 40 slowest tests at the end, which is where to look
before adding more. A multi-rank test that runs past its time fails with every rank's Python stack in its message
(faulthandler on SIGABRT; `tests/helpers/pretrain_runner.py`, `run_ranks`). With workers, torch runs one OpenMP
thread per process unless `OMP_NUM_THREADS` is set.

Other lanes: `python -m pytest -m musa_sim` (the simulated MUSA device, [backends.md](backends.md)); GPU-marked
tests run on a machine with a GPU through `scripts/gpu_conformance.sh` and `scripts/device_check.sh`
([device_runs.md](device_runs.md)). Record the durations the scheduler and this page read with
`MTMEGATRON_RECORD_DURATIONS=tests/durations.json bash scripts/test.sh`.
"""


class _Collector:
    """Records (node id, marker names) of every collected test, and collection errors."""

    def __init__(self):
        self.items: list[tuple[str, set[str]]] = []
        self.deselected: list[tuple[str, set[str]]] = []
        self.errors: list[str] = []

    @staticmethod
    def _rows(items):
        return [(item.nodeid, {m.name for m in item.iter_markers()}) for item in items]

    def pytest_deselected(self, items):
        """Tests tests/conftest.py leaves out on this machine (a backend's params where it is not installed)."""
        self.deselected += self._rows(items)

    def pytest_collection_finish(self, session):
        self.items = self._rows(session.items)

    def pytest_collectreport(self, report):
        if report.failed:
            self.errors.append(report.nodeid)


def collect() -> _Collector:
    import pytest

    collector = _Collector()
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", "tests"], plugins=[collector])
    finally:
        os.chdir(cwd)
    return collector


def file_of(nodeid: str) -> str:
    """The test file of a node id (an xdist ``@group`` suffix dropped)."""
    return nodeid.split("@", 1)[0].split("::", 1)[0]


def directory(nodeid: str) -> str:
    """``tests/models/test_x.py::t`` -> ``tests/models``; a file directly under tests/ -> ``tests/``."""
    path = file_of(nodeid)
    parts = path.split("/")
    return "/".join(parts[:2]) if len(parts) > 2 else parts[0] + "/"


def table(collector: _Collector, durations: dict | None) -> str:
    rows = collections.defaultdict(lambda: collections.Counter())
    files = collections.defaultdict(set)
    for selected, group in ((True, collector.items), (False, collector.deselected)):
        for nodeid, marks in group:
            d = directory(nodeid)
            rows[d]["tests"] += 1
            rows[d]["ci"] += selected and "gpu" not in marks
            rows[d]["gpu"] += "gpu" in marks
            rows[d]["musa_sim"] += "musa_sim" in marks
            files[d].add(file_of(nodeid))
    head = "| directory | tests | run by CI (not gpu) | gpu | musa_sim |"
    rule = "|---|---|---|---|---|"
    if durations is not None:
        head, rule = head + " recorded s |", rule + "---|"
    lines = [head, rule]
    total = collections.Counter()
    seconds_total = 0.0
    for d in sorted(rows):
        c = rows[d]
        total.update(c)
        line = f"| `{d}` | {c['tests']} | {c['ci']} | {c['gpu']} | {c['musa_sim']} |"
        if durations is not None:
            seconds = sum(durations.get(f, {}).get("seconds", 0.0) for f in files[d])
            seconds_total += seconds
            line += f" {seconds:.0f} |"
        lines.append(line)
    line = f"| all | {total['tests']} | {total['ci']} | {total['gpu']} | {total['musa_sim']} |"
    if durations is not None:
        line += f" {seconds_total:.0f} |"
    lines.append(line)
    return "\n".join(lines)


def render(collector: _Collector, durations: dict | None) -> str:
    every = collector.items + collector.deselected
    out = [HOW, "## The suite, collected\n",
           f"`pytest --collect-only -q tests`: {len(every)} tests in {len({file_of(n) for n, _ in every})} files. "
           "`gpu`: marked for a CUDA or MUSA device (tests/conftest.py leaves them out where that backend is not "
           "installed; scripts/gpu_conformance.sh runs them); `musa_sim`: the simulated-MUSA lane, part of CI.\n",
           table(collector, durations), ""]
    if collector.errors:
        out.append("Collection errors (these files' tests are not counted): "
                   + ", ".join(f"`{e}`" for e in sorted(collector.errors)) + "\n")
    if durations is None:
        out.append("No recorded durations (`tests/durations.json` is absent): record a whole run to add them.\n")
    else:
        out.append("Recorded seconds: the sum over each directory's files in `tests/durations.json` (one whole run "
                   "of `scripts/test.sh`, its machine and load not recorded; a file not in it counts 0).\n")
    return "\n".join(out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=os.path.join(ROOT, "docs", "testing.md"))
    args = p.parse_args(argv)
    durations = None
    if os.path.isfile(DURATIONS):
        with open(DURATIONS) as f:
            durations = json.load(f)
    collector = collect()
    if not collector.items:
        print("testing_doc: no tests collected", file=sys.stderr)
        return 1
    with open(args.out, "w") as f:
        f.write(render(collector, durations))
    print(f"testing_doc: wrote {args.out} ({len(collector.items)} tests)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
