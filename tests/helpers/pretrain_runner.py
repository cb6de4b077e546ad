"""Launches ``mtmegatron.pretrain`` the way users do (torchrun) and reads back metrics.jsonl."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from helpers.ports import free_port  # noqa: F401  (re-exported: tests import it from here)

TINY = [
    "--backend", "cpu", "--model", "llama3", "--num-layers", "4", "--hidden-size", "64",
    "--num-attention-heads", "4", "--num-query-groups", "2", "--ffn-hidden-size", "128", "--seq-length", "32",
    "--max-position-embeddings", "32", "--vocab-size", "256", "--micro-batch-size", "2",
    "--global-batch-size", "8", "--lr", "3e-3", "--lr-decay-style", "constant", "--mock-data",
    "--hidden-dropout", "0", "--attention-dropout", "0", "--log-interval", "100",
]


LAUNCHER_VARS = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR",
                  "MASTER_PORT", "TORCHELASTIC_RUN_ID"}


def run_pretrain(nproc: int, args: list[str], log_dir: Path, timeout: int = 300, expect_ok: bool = True,
                 env: dict | None = None):
    """Run pretrain on ``nproc`` ranks; returns (completed process, metrics rows)."""
    if nproc == 1:
        cmd = [sys.executable, "-m", "mtmegatron.pretrain"]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}",
               f"--master_port={free_port()}", "-m", "mtmegatron.pretrain"]
    # a launcher's variables left in this process by other tests must not leak into the job
    inherited = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS}
    # one rank: no MASTER_PORT, so its store binds a port the kernel picks (training/setup.py)
    env = {**inherited, "OMP_NUM_THREADS": "1", **(env or {})}
    proc = subprocess.run(cmd + args + ["--log-dir", str(log_dir)], capture_output=True, text=True,
                          timeout=timeout, env=env)
    if expect_ok and proc.returncode != 0:
        raise AssertionError(f"pretrain failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")
    metrics = log_dir / "metrics.jsonl"
    rows = [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.exists() else []
    return proc, rows
