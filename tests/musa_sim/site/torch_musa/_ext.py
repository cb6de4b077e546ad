"""Loads the compiled simulator extension (tests/musa_sim/csrc/musa_sim.cpp) exactly once.

May assume: either ``MUSA_SIM_EXT`` names the built module (scripts/musa_sim.sh and the test helpers set it), or
tests/musa_sim/build.py sits two directories above this package (a checkout), in which case it is built here.
Loading it registers the PrivateUse1 allocator, guard, hooks and kernels in this process for good.
"""

from __future__ import annotations

import importlib.util
import os
import pathlib


def _module_path() -> str:
    path = os.environ.get("MUSA_SIM_EXT")
    if path:
        return path
    build_py = pathlib.Path(__file__).resolve().parents[2] / "build.py"
    spec = importlib.util.spec_from_file_location("_musa_sim_build", build_py)
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    return str(build.build())


def _load():
    import torch  # noqa: F401  (the extension links against libtorch)

    spec = importlib.util.spec_from_file_location("musa_sim_ext", _module_path())
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ext = _load()
