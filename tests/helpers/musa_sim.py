"""Test helpers for the simulated MUSA device (tests/musa_sim, scripts/musa_sim.sh).

The stand-in torch_musa renames PrivateUse1 for good, so a pytest process must never import it: these helpers
run code in subprocesses with the simulator on their path (torch autoloads the stand-in through its
``torch.backends`` entry point, as it does the real torch_musa).

May assume: torch and torchada are installed; building the extension the first time takes ~30-60 s and is cached.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

from helpers.child_path import with_tests_on_path

REPO = pathlib.Path(__file__).resolve().parents[2]
SITE = REPO / "tests" / "musa_sim" / "site"
BUILD_PY = REPO / "tests" / "musa_sim" / "build.py"
LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                 "TORCHELASTIC_RUN_ID", "GROUP_RANK", "ROLE_RANK")

_ext_path: str | None = None


def extension_path() -> str:
    """Path of the built simulator module (built in a subprocess on first use: importing it here is harmless,
    but building in a child keeps compiler output and torch.utils.cpp_extension state out of pytest)."""
    global _ext_path
    if _ext_path is None:
        done = subprocess.run([sys.executable, str(BUILD_PY)], capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            raise RuntimeError(f"building the musa simulator failed:\n{done.stderr[-4000:]}")
        _ext_path = done.stdout.strip().splitlines()[-1]
    return _ext_path


def sim_env(extra: dict | None = None) -> dict:
    """Environment for a subprocess that runs on the simulated MUSA device (builds the simulator first)."""
    # visible-device variables of the calling process would shrink the simulator (torchada copies CUDA's to MUSA's)
    env = {k: v for k, v in os.environ.items()
           if k not in LAUNCHER_VARS and k not in ("MUSA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES")}
    env["MUSA_SIM_EXT"] = extension_path()
    env.setdefault("MUSA_SIM_DEVICE_COUNT", "8")
    env = with_tests_on_path(env, SITE)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.update(extra or {})
    return env


# Appended to every snippet that ran to its end: run the atexit handlers (the simulator's stats file, the stand-in
# MCCL's teardown), flush, and leave without finalizing the interpreter. A backward pass on a PrivateUse1 device
# starts autograd's per-device threads; at interpreter finalization one of them may still be re-taking the GIL
# (pybind11's noexcept gil_scoped_release destructor), Python ends it with pthread_exit and the forced unwind
# through the noexcept frame aborts: "terminate called without an active exception" (exit -6; seen once in one
# CI run, 0 in 100 local reruns of that snippet). That is torch's exit race (pytorch#47776, #50893), not the
# simulator's.
_EXIT_WITHOUT_FINALIZING = """
import atexit as _atexit, os as _os, sys as _sys
_atexit._run_exitfuncs()
_sys.stdout.flush()
_sys.stderr.flush()
_os._exit(0)
"""


def run_python_in_sim(code: str, env: dict | None = None, timeout: float = 120.0,
                      check: bool = True) -> subprocess.CompletedProcess:
    """Run ``python -c code`` on the simulated device; with ``check`` a non-zero exit fails with its output.
    A snippet that raises exits non-zero as usual; one that ends leaves through ``_EXIT_WITHOUT_FINALIZING``."""
    done = subprocess.run([sys.executable, "-c", code + "\n" + _EXIT_WITHOUT_FINALIZING], env=env or sim_env(),
                          capture_output=True, text=True, timeout=timeout)
    if check and done.returncode != 0:
        raise AssertionError(f"simulated-MUSA subprocess failed ({done.returncode}):\n"
                             f"--- stdout\n{done.stdout[-4000:]}\n--- stderr\n{done.stderr[-6000:]}")
    return done


def read_stats(directory) -> dict[str, dict]:
    """The per-process stats files (``rank<RANK>-pid<pid>.json``) under ``directory``, by file stem."""
    return {p.stem: json.loads(p.read_text()) for p in sorted(pathlib.Path(directory).glob("rank*-pid*.json"))}


def assert_device_run(stdout: str, stats_dir, ranks: int = 2) -> None:
    """What every simulated-device run shows: the mccl backend, rank 0's placement line (everything on
    ``musa:<rank>``), and each rank's stats: collectives ran, no host tensor refused, allocations on its own device
    (stats of torchrun's agent, rank None, left out)."""
    assert "backend musa (mccl)" in stdout, stdout[-2000:]
    assert "placement: all" in stdout and "on musa:0" in stdout, stdout[-2000:]
    stats = [s for s in read_stats(stats_dir).values() if s["rank"] is not None]
    assert sorted(s["rank"] for s in stats) == [str(r) for r in range(ranks)], stats
    for s in stats:
        assert not s["refusals"], s
        assert sum(op["calls"] for op in s["collectives"].values()) > 0, s
        assert s["memory"][s["rank"]]["num_allocs"] > 0, s
