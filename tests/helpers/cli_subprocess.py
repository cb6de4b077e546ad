"""``run_cli(*argv)``: ``python -m mtmegatron.cli ARGV`` in a subprocess with ``ENV`` (one OpenMP thread, the HF hub
offline, no Python warnings); a non-zero exit fails with the tail of its output."""

from __future__ import annotations

import os
import subprocess
import sys

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONWARNINGS": "ignore"}


def run_cli(*argv: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "mtmegatron.cli", *argv], capture_output=True, text=True,
                          env=ENV, timeout=300)
    assert proc.returncode == 0, f"mtmegatron {' '.join(argv)} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    return proc
