"""The N-rank harness: ``run_ranks(worker, world_size, backend_name, *args)`` (also the ``run_ranks`` fixture of
tests/conftest.py).

It starts one process per rank (torch.multiprocessing; forkserver with megatron-core preloaded for the cpu backend,
~3x faster than spawn on 2 cores; spawn otherwise; ``MTMEGATRON_TEST_START_METHOD`` overrides. Not plain fork: a
rank forked from a pytest process whose earlier tests ran torch's OpenMP thread pool can hang in its first parallel
region), calls ``worker(rank, world_size, backend_name, *args)`` in each with MASTER_ADDR/MASTER_PORT/RANK/
WORLD_SIZE/LOCAL_RANK set, and returns the per-rank return values (tensors converted to numpy). Any rank's
exception, crash or hang fails the caller with every rank's traceback; a rank still running at the timeout (or 10 s
after a peer failed) gets SIGABRT first, and faulthandler, enabled in each rank, puts every thread's Python stack
of it (or of a rank that crashed in native code) into the failure.

May assume: workers are module-level functions of an importable module (a test module or a helpers module); a
rank process gets the pytest process's ``sys.path`` (multiprocessing passes it), so it imports this module as
``helpers.ranks`` and the worker by its own module name.
"""

from __future__ import annotations

import faulthandler
import os
import queue as queue_module
import shutil
import tempfile
import time
import traceback

import pytest

from helpers.ports import free_port

START_METHOD_ENV = "MTMEGATRON_TEST_START_METHOD"


def _to_plain(value):
    """Tensors -> numpy (by value), recursively, so results cross the queue without shared memory."""
    import torch

    if isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy()
    if isinstance(value, dict):
        return {k: _to_plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_to_plain(v) for v in value)
    return value


def _rank_main(worker, rank: int, world_size: int, port: int, backend_name: str, args: tuple, results,
               stacks_path: str) -> None:
    """The entry of one rank process."""
    global _STACKS_FILE
    _STACKS_FILE = open(stacks_path, "w")  # noqa: SIM115 - faulthandler writes to it until the process ends
    faulthandler.enable(file=_STACKS_FILE, all_threads=True)
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world_size),
        LOCAL_RANK=str(rank),
    )
    try:
        value = _to_plain(worker(rank, world_size, backend_name, *args))
        results.put((rank, "ok", value))
    except BaseException:  # noqa: BLE001 - reported to the parent with the traceback
        results.put((rank, "error", traceback.format_exc()))
    finally:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()


def _start_method(device_type: str) -> str:
    if os.environ.get(START_METHOD_ENV):
        return os.environ[START_METHOD_ENV]
    return "forkserver" if device_type == "cpu" else "spawn"  # a device context does not survive fork


def run_ranks(worker, world_size: int, backend_name: str, *args, timeout: float = 300.0) -> list:
    """Run ``worker`` on ``world_size`` ranks; return its results ordered by rank (see module docstring)."""
    import torch.multiprocessing as mp

    from mtmegatron.backends import get_backend

    backend = get_backend(backend_name)
    if backend.device_type != "cpu":
        num_devices = backend.device_module().device_count()
        if num_devices < world_size:
            pytest.skip(f"{world_size} ranks need {world_size} {backend.name} devices; this machine has {num_devices}")

    method = _start_method(backend.device_type)
    ctx = mp.get_context(method)
    if method == "forkserver":
        # The server imports megatron-core once and forks ranks from its clean state (~5 s per rank otherwise).
        ctx.set_forkserver_preload(["megatron.core.parallel_state", "megatron.core.tensor_parallel"])
    results = ctx.Queue()
    port = free_port()
    stacks_dir = tempfile.mkdtemp(prefix="mtmegatron-rank-stacks-")
    stacks = [os.path.join(stacks_dir, f"rank{rank}.txt") for rank in range(world_size)]
    procs = []
    for rank in range(world_size):
        proc = ctx.Process(target=_rank_main, daemon=True,
                           args=(worker, rank, world_size, port, backend_name, args, results, stacks[rank]))
        proc.start()
        procs.append(proc)

    outcome: dict[int, tuple[str, object]] = {}
    deadline = time.monotonic() + timeout
    first_error_at = None
    while len(outcome) < world_size:
        now = time.monotonic()
        # Once a rank failed the others usually block in a collective: give them a short grace, then stop.
        if now > deadline or (first_error_at is not None and now > first_error_at + 10):
            break
        try:
            rank, status, value = results.get(timeout=0.5)
            outcome[rank] = (status, value)
            if status == "error" and first_error_at is None:
                first_error_at = time.monotonic()
        except queue_module.Empty:
            for rank, proc in enumerate(procs):
                if rank not in outcome and proc.exitcode not in (None, 0):
                    outcome[rank] = ("error", f"process exited with code {proc.exitcode} without a result")
                    first_error_at = first_error_at or time.monotonic()
    hung = [rank for rank, proc in enumerate(procs) if rank not in outcome and proc.is_alive()]
    if hung:
        from helpers.pretrain_runner import abort_without_core

        for rank in hung:  # faulthandler writes the rank's stacks, then it ends
            abort_without_core(procs[rank].pid)
    for proc in procs:
        proc.join(timeout=5)
        if proc.is_alive():
            proc.terminate()
            proc.join(timeout=5)

    problems = []
    for rank in range(world_size):
        status, value = outcome.get(rank, ("error", "no result (hung: stopped after the timeout or a peer's failure)"))
        with open(stacks[rank]) as f:
            dumped = f.read()[-20000:]  # the stacks of a hung rank (SIGABRT) or of a crash in native code
        if status != "ok" and dumped:
            value += f"\nPython stacks (faulthandler{', SIGABRT after the timeout' if rank in hung else ''}):\n{dumped}"
        if status != "ok":
            problems.append(f"--- rank {rank} ---\n{value}")
    shutil.rmtree(stacks_dir, ignore_errors=True)
    if problems:
        pytest.fail(f"{worker.__name__} failed on {len(problems)}/{world_size} ranks:\n" + "\n".join(problems))
    return [outcome[rank][1] for rank in range(world_size)]
