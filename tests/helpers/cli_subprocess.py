"""``run_cli(*argv)``: ``python -m mtmegatron.cli ARGV`` in a subprocess with ``ENV`` (one OpenMP thread, the HF hub
offline, no Python warnings); a non-zero exit fails with the tail of its output. The job starts through
helpers/pretrain_runner.run_job: forked from a Python that already imported torch (helpers/warm_start.py), and past
its 300 s it fails with its Python stack."""

from __future__ import annotations

import os
import subprocess
import sys

from helpers.pretrain_runner import run_job

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONWARNINGS": "ignore"}


def run_cli(*argv: str) -> subprocess.CompletedProcess:
    proc = run_job([sys.executable, "-m", "mtmegatron.cli", *argv], ENV, timeout=300,
                   what=f"mtmegatron {' '.join(argv[:2])}")
    assert proc.returncode == 0, f"mtmegatron {' '.join(argv)} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    return proc
