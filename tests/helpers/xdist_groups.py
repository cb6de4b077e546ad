"""``group_for_xdist(items)``: under ``-n N --dist loadgroup`` (scripts/test.sh) the tests of a file that share a
module fixture stay on one worker, so the fixture runs once; the directories in ``SESSION_FIXTURE_DIRS`` stay
together as a whole; every other test is handed out on its own (a file of independent multi-rank tests spreads over
both workers). Without xdist the mark is inert.

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
