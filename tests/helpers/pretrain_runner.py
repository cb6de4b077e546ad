"""Launches ``mtmegatron.pretrain`` the way users do (torchrun) and reads back metrics.jsonl.

A job that runs past its time fails with every rank's Python stack in the message (``stop_with_stacks``): jobs
start with ``PYTHONFAULTHANDLER`` set, so SIGABRT makes each rank write every thread's stack to its stderr (so
does a crash in native code) before it ends.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from helpers import warm_start
from helpers.warm_start import WarmJob
from helpers.ports import free_port  # noqa: F401  (re-exported: tests import it from here)

TINY = [
    "--backend", "cpu", "--model", "llama3", "--num-layers", "4", "--hidden-size", "64",
    "--num-attention-heads", "4", "--num-query-groups", "2", "--ffn-hidden-size", "128", "--seq-length", "32",
    "--max-position-embeddings", "32", "--vocab-size", "256", "--micro-batch-size", "2",
    "--global-batch-size", "8", "--lr", "3e-3", "--lr-decay-style", "constant", "--mock-data",
    "--hidden-dropout", "0", "--attention-dropout", "0", "--log-interval", "100",
    # read in the rank's own process: DataLoader workers (the default 2) add two forked readers per rank, and on
    # a 2-core box running two 4-rank jobs their fd passing (torch's resource_sharer) has crashed (SIGSEGV) or left a
    # rank waiting; workers are proven to read the same batches in tests/data/test_data_flags.py and to exit with
    # the job in tests/robustness/test_signals_torchrun.py
    "--num-workers", "0",
]


LAUNCHER_VARS = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR",
                  "MASTER_PORT", "TORCHELASTIC_RUN_ID"}
STACKS_ENV = {"PYTHONFAULTHANDLER": "1"}  # faulthandler.enable() at start-up: SIGABRT dumps every thread's stack
_FAULTHANDLER_HEADER = "Fatal Python error: Aborted"


def abort_without_core(pid: int) -> None:
    """SIGABRT to ``pid`` (faulthandler dumps its stacks), with no core file whatever the machine's limit."""
    try:
        resource.prlimit(pid, resource.RLIMIT_CORE, (0, 0))
    except OSError:
        pass
    try:
        os.kill(pid, signal.SIGABRT)
    except OSError:
        pass


def _ranks_and_tree(proc: subprocess.Popen):
    """(the job's ranks: torchrun's children, or the lone process; every process of the job)."""
    try:
        root = psutil.Process(proc.pid)
        tree = [root] + root.children(recursive=True)
        argv = proc.args if isinstance(proc, WarmJob) else root.cmdline()  # a warm job's cmdline is its server's
        launcher = any(a in ("torch.distributed.run", "torchrun") or a.endswith("/torchrun") for a in argv)
        return (root.children() if launcher else [root]), tree
    except psutil.Error:
        return [], []


def _signal_quietly(p: psutil.Process, action: str) -> None:
    try:
        getattr(p, action)()
    except psutil.Error:
        pass


def _wait_gone(p: psutil.Process, timeout: float) -> None:
    """Until ``p`` has ended (gone or a zombie), at most ``timeout`` s; never reaps it (its parent does)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if p.status() == psutil.STATUS_ZOMBIE:
                return
        except psutil.Error:
            return
        time.sleep(0.02)


def stop_with_stacks(proc: subprocess.Popen, grace: float = 20.0) -> tuple[str, str]:
    """A job past its time: SIGABRT to each rank (faulthandler writes its stacks to stderr and the rank ends),
    then every process of the job still there is killed. Returns the job's (stdout, stderr), text pipes."""
    ranks, tree = _ranks_and_tree(proc)
    # one rank at a time: ranks share the job's stderr, and stacks written at once interleave byte by byte. The
    # launcher is frozen first: once a rank dies, torchrun SIGTERMs the others, and a SIGTERM arriving while a
    # rank's faulthandler writes its stacks ends that rank with nothing written (seen in CI). The other ranks
    # stay frozen meanwhile too.
    launcher = [p for p in tree[:1] if p not in ranks]
    for p in launcher + ranks:
        _signal_quietly(p, "suspend")
    for p in ranks:
        abort_without_core(p.pid)
        _signal_quietly(p, "resume")
        _wait_gone(p, timeout=5.0)
    for p in launcher:  # it reaps its ranks and reports them failed
        _signal_quietly(p, "resume")
    try:
        out, err = proc.communicate(timeout=grace)
    except subprocess.TimeoutExpired:  # a rank's children can hold the pipes open
        for p in tree:
            try:
                p.kill()
            except psutil.Error:
                pass
        out, err = proc.communicate()
    for p in tree:  # orphans: ranks of a killed torchrun, DataLoader workers
        try:
            p.kill()
        except psutil.Error:
            pass
    return out or "", err or ""


def hang_report(what: str, timeout: float, out: str, err: str) -> str:
    """The failure text of a job stopped by ``stop_with_stacks``: each rank's stacks, then the output's tails."""
    start = err.find(_FAULTHANDLER_HEADER)
    stacks = err[start:][:30000] if start >= 0 else "(no stack: no rank answered SIGABRT with faulthandler)"
    before = err[:start] if start >= 0 else err
    return (f"{what} ran past {timeout:g} s; every rank's Python stack (faulthandler on SIGABRT):\n{stacks}\n"
            f"--- stdout (tail) ---\n{out[-3000:]}\n--- stderr before the stacks (tail) ---\n{before[-3000:]}")


def run_job(cmd: list[str], env: dict, timeout: float, what: str = "job") -> subprocess.CompletedProcess:
    """``subprocess.run(cmd, capture_output=True, text=True)``; past ``timeout`` the job is stopped with every
    rank's stack in the AssertionError (``stop_with_stacks``). ``python -m`` of mtmegatron.pretrain/cli or torchrun
    is forked from a Python that already imported torch (helpers/warm_start.py: same argv, environment, directory)."""
    # forked from a Python that already imported torch where the job allows it (helpers/warm_start.py)
    proc = warm_start.start(cmd, env) or subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                                          text=True, env=env)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        raise AssertionError(hang_report(what, timeout, *stop_with_stacks(proc))) from None
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


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
    env = {**inherited, "OMP_NUM_THREADS": "1", **STACKS_ENV, **(env or {})}
    proc = run_job(cmd + args + ["--log-dir", str(log_dir)], env, timeout, what=f"pretrain on {nproc} rank(s)")
    if expect_ok and proc.returncode != 0:
        raise AssertionError(f"pretrain failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")
    metrics = log_dir / "metrics.jsonl"
    rows = [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.exists() else []
    return proc, rows
