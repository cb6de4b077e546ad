"""``group_for_xdist(items)``: under ``-n N --dist loadgroup`` (scripts/test.sh) the tests of a file that share a
module fixture stay on one worker, so the fixture runs once; the directories in ``SESSION_FIXTURE_DIRS`` stay
together as a whole; every other test is handed out on its own (a file of independent multi-rank tests spreads over
both workers). Without xdist the mark is inert.

``keep_group_suffix(items)``: pytest-xdist 3.8's worker tells its scheduler a test's group by appending
``@<group>`` to the test's node id, written to ``item._nodeid``. pytest >= 9.2 derives ``nodeid`` from ``item._id``
instead, so the suffix was lost: every test became its own group and each module fixture ran again on every
worker that got one of its tests (a clean-clone CI run: 54.6 min, fixtures set up twice). After xdist's hook, this
copies the suffixed id into ``_id`` where the installed pytest has one. ``tests/test_xdist_grouping.py`` counts
a module fixture's set-ups under 2 workers.

May assume: ``items`` are pytest items collected under tests/ (this module's parent's parent).
"""

from __future__ import annotations

import os

import pytest

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Directories whose conftest holds a session fixture (one expensive run shared by several files): their tests must
# share one pytest-xdist worker, or each worker would repeat the run.
SESSION_FIXTURE_DIRS = ("optimizer", "tokenizers", "multimodal_data")


def _shares_a_fixture(item) -> bool:
    """Whether the test uses a fixture that outlives it (module/class/package/session scope)."""
    info = getattr(item, "_fixtureinfo", None)
    for definitions in (info.name2fixturedefs.values() if info is not None else ()):
        if any(str(getattr(d, "scope", "function")).lower().split(".")[-1] != "function" for d in definitions):
            return True
    return False


def group_for_xdist(items) -> None:
    for item in items:
        relative = os.path.relpath(str(item.path), TESTS)
        top = relative.split(os.sep)[0]
        if top in SESSION_FIXTURE_DIRS:
            item.add_marker(pytest.mark.xdist_group(top))
        elif _shares_a_fixture(item):
            item.add_marker(pytest.mark.xdist_group(relative))


def keep_group_suffix(items) -> None:
    """Make pytest-xdist's ``@group`` suffix part of the node id on a pytest that keeps node ids in ``_id``."""
    for item in items:
        suffixed = item.__dict__.get("_nodeid")
        if not suffixed or "@" not in suffixed or item.nodeid == suffixed or not hasattr(item, "_id"):
            continue
        item._id = type(item._id).parse(suffixed)


class XdistGroups:
    """The suite's plugin: marks the groups before pytest-xdist's worker reads them, keeps its suffix after."""

    @pytest.hookimpl(wrapper=True)
    def pytest_collection_modifyitems(self, config, items):
        group_for_xdist(items)
        result = yield
        keep_group_suffix(items)
        return result
