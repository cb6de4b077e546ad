"""Shared test fixtures: backend parametrization, free ports, and N-rank process groups.

``backend_name``: tests taking it run once per backend mtmegatron knows (cpu, cuda, musa, third-party).
Backends this machine cannot run are deselected at collection with the reason printed in the summary;
accelerator params carry ``@pytest.mark.gpu``. ``MTMEGATRON_REQUIRE_BACKENDS=cuda,...`` turns a missing
backend into a collection error (scripts/gpu_conformance.sh sets it so GPU tests cannot silently vanish).

``run_ranks(worker, world_size, backend_name, *args)`` starts one process per rank (torch.multiprocessing;
forkserver with megatron-core preloaded for the cpu backend, ~3x faster than spawn on 2 cores; spawn otherwise;
``MTMEGATRON_TEST_START_METHOD`` overrides. Not plain fork: a rank forked from a pytest process whose earlier
tests ran torch's OpenMP thread pool can hang in its first parallel region), calls ``worker(rank, world_size, backend_name, *args)`` in each with MASTER_ADDR/MASTER_PORT/RANK/
WORLD_SIZE/LOCAL_RANK set, and returns the per-rank return values (tensors converted to numpy). Any rank's
exception, crash or hang fails the caller with every rank's traceback; a rank still running at the timeout (or 10 s
after a peer failed) gets SIGABRT first, and faulthandler, enabled in each rank, puts every thread's Python stack
of it (or of a rank that crashed in native code) into the failure. Workers must be module-level functions
of a test module. The per-rank entry runs this file through runpy, so it never depends on which
``conftest`` module happens to be importable in the child.
"""

from __future__ import annotations

import faulthandler
import os
import queue as queue_module
import runpy
import shutil
import tempfile
import time
import traceback

import pytest

REQUIRE_ENV = "MTMEGATRON_REQUIRE_BACKENDS"
START_METHOD_ENV = "MTMEGATRON_TEST_START_METHOD"
_RANK_RUN_NAME = "__mtmegatron_rank__"


# ---- ports and ranks ------------------------------------------------------------------------------------
def find_free_port() -> int:
    from helpers.ports import free_port  # in the pytest process only (children get the port as an argument)

    return free_port()


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
    port = find_free_port()
    stacks_dir = tempfile.mkdtemp(prefix="mtmegatron-rank-stacks-")
    stacks = [os.path.join(stacks_dir, f"rank{rank}.txt") for rank in range(world_size)]
    procs = []
    for rank in range(world_size):
        entry_args = (worker, rank, world_size, port, backend_name, args, results, stacks[rank])
        proc = ctx.Process(
            target=runpy.run_path,
            args=(__file__, {"_MTMEGATRON_RANK_ARGS": entry_args}, _RANK_RUN_NAME),
            daemon=True,
        )
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


@pytest.fixture
def free_port() -> int:
    return find_free_port()


@pytest.fixture(name="run_ranks")
def run_ranks_fixture():
    return run_ranks


# ---- backend parametrization ------------------------------------------------------------------------------
def _backend_status() -> dict[str, tuple[bool, str | None, str]]:
    """name -> (available, why not, device_type) for every backend mtmegatron knows."""
    from mtmegatron.backends import BackendUnavailableError, known_backends

    status = {}
    for name, backend in known_backends().items():
        try:
            backend.require()
            status[name] = (True, None, backend.device_type)
        except BackendUnavailableError as e:
            status[name] = (False, str(e), backend.device_type)
    return status


_DESELECTED: dict[str, list[str]] = {}


def pytest_configure(config):
    # megatron-core announces its TE/Apex fallbacks on import; expected on CPU, noise in every report
    config.addinivalue_line("filterwarnings", "ignore:Transformer Engine and Apex are not installed:UserWarning")
    config._mtmegatron_backends = _backend_status()
    required = [n for n in os.environ.get(REQUIRE_ENV, "").split(",") if n]
    for name in required:
        available, why, _ = config._mtmegatron_backends.get(name, (False, f"unknown backend '{name}'", ""))
        if not available:
            raise pytest.UsageError(f"{REQUIRE_ENV} asks for backend '{name}' but it cannot run here: {why}")


def pytest_generate_tests(metafunc):
    if "backend_name" not in metafunc.fixturenames:
        return
    params = []
    for name, (_, _, device_type) in metafunc.config._mtmegatron_backends.items():
        marks = [] if device_type == "cpu" else [pytest.mark.gpu]
        params.append(pytest.param(name, marks=marks, id=name))
    metafunc.parametrize("backend_name", params)


def pytest_collection_modifyitems(config, items):
    status = config._mtmegatron_backends
    keep, drop = [], []
    for item in items:
        name = getattr(getattr(item, "callspec", None), "params", {}).get("backend_name")
        if name is not None and not status[name][0]:
            drop.append(item)
            _DESELECTED.setdefault(name, []).append(item.nodeid)
        else:
            keep.append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
    _group_for_xdist(items)


# Directories whose conftest holds a session fixture (one expensive run shared by several files): their tests must
# share one pytest-xdist worker, or each worker would repeat the run.
_SESSION_FIXTURE_DIRS = ("optimizer", "tokenizers", "multimodal_data")


def _shares_a_fixture(item) -> bool:
    """Whether the test uses a fixture that outlives it (module/class/package/session scope)."""
    info = getattr(item, "_fixtureinfo", None)
    for definitions in (info.name2fixturedefs.values() if info is not None else ()):
        if any(str(getattr(d, "scope", "function")).lower().split(".")[-1] != "function" for d in definitions):
            return True
    return False


def _group_for_xdist(items) -> None:
    """Under ``-n N --dist loadgroup`` (scripts/test.sh) the tests of a file that share a module fixture stay on
    one worker, so the fixture runs once; the directories above stay together as a whole; every other test is
    handed out on its own (a file of independent multi-rank tests spreads over both workers). Without xdist the
    mark is inert."""
    root = os.path.dirname(os.path.abspath(__file__))
    for item in items:
        relative = os.path.relpath(str(item.path), root)
        top = relative.split(os.sep)[0]
        if top in _SESSION_FIXTURE_DIRS:
            item.add_marker(pytest.mark.xdist_group(top))
        elif _shares_a_fixture(item):
            item.add_marker(pytest.mark.xdist_group(relative))


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    for name, nodeids in _DESELECTED.items():
        why = config._mtmegatron_backends[name][1]
        terminalreporter.write_line(f"deselected {len(nodeids)} '{name}' backend tests: {why}")


_ATTENTION_ENV = ("NVTE_FLASH_ATTN", "NVTE_FUSED_ATTN", "NVTE_UNFUSED_ATTN")


@pytest.fixture(autouse=True)
def _attention_env_stays_with_the_test():
    """megatron-core writes NVTE_*_ATTN into os.environ when a model is built in this process (one value per
    attention backend, and it asserts on a different inherited value): a later test's subprocess must not inherit
    them."""
    before = {k: os.environ.get(k) for k in _ATTENTION_ENV}
    yield
    for k, v in before.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture
def backend(backend_name):
    from mtmegatron.backends import get_backend

    return get_backend(backend_name)


@pytest.fixture
def activated(backend):
    """The backend, activated (bridge + patches installed) for the test, deactivated afterwards."""
    import mtmegatron

    mtmegatron.activate(backend)
    try:
        yield backend
    finally:
        mtmegatron.deactivate()


if __name__ == _RANK_RUN_NAME:  # a rank started by run_ranks (runpy.run_path of this file)
    _rank_main(*_MTMEGATRON_RANK_ARGS)  # noqa: F821 - injected by run_ranks through runpy's init_globals
