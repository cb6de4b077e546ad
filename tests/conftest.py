"""Pytest hooks and fixtures of the whole suite: backend parametrization, free ports, the N-rank harness.

``backend_name``: tests taking it run once per backend mtmegatron knows (cpu, cuda, musa, third-party).
Backends this machine cannot run are deselected at collection with the reason printed in the summary;
accelerator params carry ``@pytest.mark.gpu``. ``MTMEGATRON_REQUIRE_BACKENDS=cuda,...`` turns a missing
backend into a collection error. ``run_ranks``: tests/helpers/ranks.py (importable from any test as
``from helpers.ranks import run_ranks``). The machinery lives in tests/helpers; this file only registers it.
"""

from __future__ import annotations

import os

import pytest

from helpers.backend_params import REQUIRE_ENV, backend_status, required_backends
from helpers.ports import free_port as _free_port
from helpers.ranks import run_ranks as _run_ranks
from helpers.xdist_groups import XdistGroups
from helpers.xdist_schedule import DurationLog


@pytest.fixture
def free_port() -> int:
    return _free_port()


@pytest.fixture
def run_ranks():
    return _run_ranks


# ---- backend parametrization ------------------------------------------------------------------------------
_DESELECTED: dict[str, list[str]] = {}


def pytest_configure(config):
    # megatron-core announces its TE/Apex fallbacks on import; expected on CPU, noise in every report
    config.addinivalue_line("filterwarnings", "ignore:Transformer Engine and Apex are not installed:UserWarning")
    config._mtmegatron_backends = backend_status()
    # pytest-xdist groups (tests/helpers/xdist_groups.py): a wrapper, so the marks are set before xdist's worker
    # reads them and its node-id suffix is kept after, whatever the order of the other hooks
    config.pluginmanager.register(XdistGroups(), "mtmegatron-xdist-groups")
    if not hasattr(config, "workerinput"):  # the controller: longest groups first, and each worker's load
        config.pluginmanager.register(DurationLog(), "mtmegatron-xdist-schedule")
    for name in required_backends():
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


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    for name, nodeids in _DESELECTED.items():
        why = config._mtmegatron_backends[name][1]
        terminalreporter.write_line(f"deselected {len(nodeids)} '{name}' backend tests: {why}")


_ATTENTION_ENV = ("NVTE_FLASH_ATTN", "NVTE_FUSED_ATTN", "NVTE_UNFUSED_ATTN")


def _attention_env_restored():
    before = {k: os.environ.get(k) for k in _ATTENTION_ENV}
    yield
    for k, v in before.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


# megatron-core writes NVTE_*_ATTN into os.environ when a model is built in this process (one value per attention
# backend, and it asserts on a different inherited value): a later test's subprocess must not inherit them. Per
# test, and per module for models built by module-scoped fixtures (autouse fixtures of a scope set up before the
# others of that scope, so the module guard sees the environment before the module's fixtures build anything).
@pytest.fixture(autouse=True)
def _attention_env_stays_with_the_test():
    yield from _attention_env_restored()


@pytest.fixture(autouse=True, scope="module")
def _attention_env_stays_with_the_module():
    yield from _attention_env_restored()


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

