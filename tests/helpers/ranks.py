"""``run_ranks`` of tests/conftest.py, importable from a test in any directory.

``from conftest import run_ranks`` resolves to whichever ``conftest`` module pytest imported last: in a whole-suite
run that is a subdirectory's conftest (tests/optimizer/, tests/tokenizers/, ...), and the import fails for tests
collected after it. This loads tests/conftest.py itself, once, under its own module name.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

_NAME = "mtmegatron_tests_root_conftest"


def _root_conftest():
    if _NAME not in sys.modules:
        spec = importlib.util.spec_from_file_location(_NAME, Path(__file__).resolve().parents[1] / "conftest.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[_NAME] = module
        spec.loader.exec_module(module)
    return sys.modules[_NAME]


run_ranks = _root_conftest().run_ranks
