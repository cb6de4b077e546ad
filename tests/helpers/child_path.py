"""The one place tests put directories on a Python path: the PYTHONPATH of a child process.

pytest puts tests/ on its own ``sys.path`` (pyproject's ``pythonpath``), so tests import ``helpers`` directly; a
child started as ``python SCRIPT`` sees only the script's directory, so a script of tests/ that imports ``helpers``
(tests/generate/hf_reference.py, tests/checkpoint_interop/worker.py) gets tests/ through its environment, and a
child on the simulated MUSA device gets the stand-in torch_musa (tests/musa_sim/site) in front of it.
"""

from __future__ import annotations

import os
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def with_tests_on_path(env: dict, *first) -> dict:
    """A copy of ``env`` whose PYTHONPATH starts with the directories ``first``, then tests/, then its own."""
    paths = [*map(str, first), str(TESTS), env.get("PYTHONPATH", "")]
    return {**env, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}
