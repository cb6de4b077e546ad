"""The suite's pytest-xdist grouping works with the installed pytest: tests that share a module fixture run on one
worker, so the fixture runs once (tests/helpers/xdist_groups.py, registered by tests/conftest.py); with recorded
durations the costliest group is handed out first (tests/helpers/xdist_schedule.py).

pytest-xdist 3.8 reads a test's group from a suffix its worker appends to ``item._nodeid``; pytest 9.2 derives node
ids from ``item._id``, so without ``keep_group_suffix`` the suffix is lost and each module fixture runs again on
every worker that gets one of its tests (checked: this test fails on pytest 9.2.0 without it, 2 set-ups). Here: a
module fixture shared by 6 tests, run on 2 workers with the suite's own plugin, counts its set-ups. ~6 s.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent

CONFTEST = """
from helpers.xdist_groups import XdistGroups
from helpers.xdist_schedule import DurationLog

def pytest_configure(config):
    config.pluginmanager.register(XdistGroups(), "mtmegatron-xdist-groups")
    if not hasattr(config, "workerinput"):
        config.pluginmanager.register(DurationLog(), "mtmegatron-xdist-schedule")
"""

SHARED_FIXTURE = """
import os, time
import pytest

@pytest.fixture(scope="module")
def shared():
    with open(os.environ["SETUP_LOG"], "a") as log:
        log.write(f"{os.environ.get('PYTEST_XDIST_WORKER')}\\n")
    return 1

@pytest.mark.parametrize("i", range(6))
def test_uses_shared(shared, i):
    time.sleep(0.2)
    assert shared == 1
"""


CHEAP_FIRST = """
import os
import pytest

@pytest.fixture(scope="module")
def cheap():
    with open(os.environ["SETUP_LOG"], "a") as log:
        log.write("cheap\\n")

@pytest.mark.parametrize("i", range(8))
def test_cheap(cheap, i):
    pass
"""


def _pytest(tmp_path, files, workers, env=()):
    env = {**os.environ, "SETUP_LOG": str(tmp_path / "setups.txt"), **dict(env),
           "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", str(workers),
                           "--dist", "loadgroup", "--rootdir", str(tmp_path), *map(str, files)],
                          capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


def test_a_module_fixture_runs_once_under_two_workers(tmp_path):
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_shared.py").write_text(SHARED_FIXTURE)
    log = tmp_path / "setups.txt"
    _pytest(tmp_path, [tmp_path / "test_shared.py"], 2)
    setups = log.read_text().split()
    assert len(setups) == 1, (
        f"the module fixture ran {len(setups)} times (workers {setups}): pytest-xdist's --dist loadgroup does not "
        f"keep the groups with this pytest ({__import__('pytest').__version__}); see this module's docstring")


def test_the_costliest_recorded_group_goes_first(tmp_path):
    """test_a_cheap.py's group is collected first and has more tests (pytest-xdist's own order: first); recorded
    as the cheaper file, it runs after test_shared.py's group. Fails without the longest-first order."""
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_a_cheap.py").write_text(CHEAP_FIRST)
    (tmp_path / "test_shared.py").write_text(SHARED_FIXTURE)
    recorded = tmp_path / "durations.json"
    recorded.write_text(json.dumps({"files": {"test_a_cheap.py": {"seconds": 0.1, "tests": 8},
                                              "test_shared.py": {"seconds": 60.0, "tests": 6}}}))
    out = _pytest(tmp_path, [tmp_path / "test_a_cheap.py", tmp_path / "test_shared.py"], 1,
                  {"MTMEGATRON_DURATIONS": str(recorded)})
    assert "longest first (2 recorded files)" in out, out[-2000:]
    assert (tmp_path / "setups.txt").read_text().split() == ["gw0", "cheap"]
