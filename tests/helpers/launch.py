"""Starts ``mtmegatron.pretrain`` under torchrun without waiting, for tests that signal or kill its ranks.
``wait_for`` and ``finish`` stop a job past its time with every rank's Python stack in the failure
(helpers/pretrain_runner.py's ``stop_with_stacks``)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psutil

from helpers.pretrain_runner import LAUNCHER_VARS, STACKS_ENV, free_port, hang_report, stop_with_stacks


def launch(nproc: int, args: list[str], log_dir: Path, extra_env: dict | None = None,
           new_session: bool = False) -> subprocess.Popen:
    """``new_session``: torchrun leads its own process group (``os.killpg(proc.pid, sig)`` signals it as a shell's
    job control or a scheduler would)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}",
           f"--master_port={free_port()}", "-m", "mtmegatron.pretrain", *args, "--log-dir", str(log_dir)]
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS}
    env.update({"OMP_NUM_THREADS": "1", **STACKS_ENV, **(extra_env or {})})
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=new_session)


def wait_for(predicate, proc: subprocess.Popen, timeout: float = 300.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if proc.poll() is not None:
            out, err = proc.communicate()
            raise AssertionError(f"job exited ({proc.returncode}) before {what}:\n{out[-3000:]}\n{err[-4000:]}")
        time.sleep(0.1)
    raise AssertionError(hang_report(f"the job waiting for {what}", timeout, *stop_with_stacks(proc)))


def finish(proc: subprocess.Popen, timeout: float = 180.0) -> tuple[str, str]:
    """``proc.communicate(timeout=...)``; past it the job is stopped with every rank's stack in the failure."""
    try:
        return proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        raise AssertionError(hang_report("the job", timeout, *stop_with_stacks(proc))) from None


def rank_pid(proc: subprocess.Popen, rank: int) -> int:
    """The pid of the worker with this RANK among torchrun's children."""
    for child in psutil.Process(proc.pid).children(recursive=True):
        try:
            if child.environ().get("RANK") == str(rank):
                return child.pid
        except psutil.Error:
            continue
    raise AssertionError(f"no worker with RANK={rank}")


def rows(log_dir: Path) -> list[str]:
    metrics = log_dir / "metrics.jsonl"
    return metrics.read_text().splitlines() if metrics.exists() else []
