"""The suite's pytest-xdist grouping works with the installed pytest: tests that share a module fixture run on one
worker, so the fixture runs once (tests/helpers/xdist_groups.py, registered by tests/conftest.py).

pytest-xdist 3.8 reads a test's group from a suffix its worker appends to ``item._nodeid``; pytest 9.2 derives node
ids from ``item._id``, so without ``keep_group_suffix`` the suffix is lost and each module fixture runs again on
every worker that gets one of its tests (checked: this test fails on pytest 9.2.0 without it, 2 set-ups). Here: a
module fixture shared by 6 tests, run on 2 workers with the suite's own plugin, counts its set-ups. ~6 s.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent

CONFTEST = """
from helpers.xdist_groups import XdistGroups

def pytest_configure(config):
    config.pluginmanager.register(XdistGroups(), "mtmegatron-xdist-groups")
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


def test_a_module_fixture_runs_once_under_two_workers(tmp_path):
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_shared.py").write_text(SHARED_FIXTURE)
    log = tmp_path / "setups.txt"
    env = {**os.environ, "SETUP_LOG": str(log), "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get(
        "PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2", "--dist",
                           "loadgroup", "--rootdir", str(tmp_path), str(tmp_path / "test_shared.py")],
                          capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    setups = log.read_text().split()
    assert len(setups) == 1, (
        f"the module fixture ran {len(setups)} times (workers {setups}): pytest-xdist's --dist loadgroup does not "
        f"keep the groups with this pytest ({__import__('pytest').__version__}); see this module's docstring")
