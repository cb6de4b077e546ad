"""Issue 13's acceptance command: the llama3 default model on 2 ranks with the distributed optimizer, half the
optimizer offloaded to the host, the precision-aware optimizer, overlapped grad reduce and param gather and full
recompute, 30 iterations: exits 0, the loss falls, and every loss equals the same command without the five
memory flags within 1e-5 (first iteration exactly)."""

from __future__ import annotations

import pytest

from equivalence import assert_same_losses
from helpers.pretrain_runner import run_pretrain

COMMAND = ["--backend", "cpu", "--model", "llama3", "--mock-data", "--use-distributed-optimizer",
           "--train-iters", "30", "--num-samples", "0"]
MEMORY = ["--optimizer-cpu-offload", "--optimizer-offload-fraction", "0.5", "--use-precision-aware-optimizer",
          "--overlap-grad-reduce", "--overlap-param-gather", "--recompute-granularity", "full",
          "--recompute-method", "uniform", "--recompute-num-layers", "1"]


@pytest.mark.slow
def test_acceptance_command(tmp_path):
    _, base = run_pretrain(2, COMMAND, tmp_path / "base", timeout=900)
    proc, rows = run_pretrain(2, COMMAND + MEMORY, tmp_path / "memory", timeout=900)
    assert proc.returncode == 0
    worst = assert_same_losses(base, rows, iters=30)
    assert rows[-1]["loss"] < rows[0]["loss"]
    print(f"acceptance: max relative loss difference {worst:.2e}")
