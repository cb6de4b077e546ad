"""Conformance: backend selection (``--backend`` > MTMEGATRON_BACKEND > entry points > auto-detect) and its
errors, in-process with a fake environ, fake entry points and a simulated torch_musa/torchada/CUDA.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import pathlib
import re
import sys
import types
from dataclasses import dataclass

import pytest
import torch
import torch.distributed as dist

from mtmegatron.backends import Backend, BackendUnavailableError, base, registry
from mtmegatron.backends.cpu import CPU
from mtmegatron.backends.cuda import CUDA
from mtmegatron.backends.musa import MUSA, MUSA_ENV_DEFAULTS


@dataclass(frozen=True)
class _FakeBackend(Backend):
    reason: str | None = None

    def missing(self):
        return self.reason


def _fake(name, reason=None, device_type=None):
    return _FakeBackend(name=name, device_type=device_type or name, visible_devices_env=None,
                        kernel_dispatch_key="PrivateUse1", bridge_module="mtmegatron.bridge.cuda", reason=reason)


class _EntryPoint:
    def __init__(self, name, obj):
        self.name, self.value, self._obj = name, f"fake_pkg:{name}", obj

    def load(self):
        return self._obj


@pytest.fixture(autouse=True)
def _fresh_availability_cache():
    base._cached_missing.cache_clear()
    yield
    base._cached_missing.cache_clear()


@pytest.fixture
def entry_points(monkeypatch):
    """Set the backends registered through the ``mtmegatron.backends`` entry-point group."""
    registered: list[_EntryPoint] = []

    def fake_entry_points(group=None, **kw):
        assert group == registry.ENTRY_POINT_GROUP
        return list(registered)

    monkeypatch.setattr(registry, "entry_points", fake_entry_points)

    def register(**named):
        registered.extend(_EntryPoint(n, obj) for n, obj in named.items())

    return register


# ---- precedence --------------------------------------------------------------------------------------------
def test_explicit_beats_env_beats_entry_point_beats_auto_detect(entry_points):
    entry_points(acme=_fake("acme"))
    assert registry.select_backend("cpu", environ={registry.ENV_VAR: "acme"}) is CPU
    assert registry.select_backend(None, environ={registry.ENV_VAR: "cpu"}) is CPU
    assert registry.select_backend(None, environ={registry.ENV_VAR: "acme"}).name == "acme"
    assert registry.select_backend("acme", environ={}).name == "acme"
    assert registry.select_backend(None, environ={}).name == "acme", "an available third-party backend wins auto-detect"


def test_unavailable_third_party_backend_is_skipped_by_auto_detect(entry_points):
    entry_points(acme=_fake("acme", reason="the acme driver is not loaded"))
    assert registry.select_backend(None, environ={}).name in ("musa", "cuda", "cpu")
    with pytest.raises(BackendUnavailableError, match="acme requested but the acme driver is not loaded"):
        registry.select_backend(None, environ={registry.ENV_VAR: "acme"})


def test_auto_detect_order_is_musa_then_cuda_then_cpu(entry_points, monkeypatch):
    fake_cuda, fake_musa = _fake("cuda"), _fake("musa")
    monkeypatch.setattr(registry, "CUDA", fake_cuda)
    assert registry.select_backend(None, environ={}) is fake_cuda
    monkeypatch.setattr(registry, "MUSA", fake_musa)
    assert registry.select_backend(None, environ={}) is fake_musa
    monkeypatch.setattr(registry, "CUDA", _fake("cuda", reason="no"))
    monkeypatch.setattr(registry, "MUSA", _fake("musa", reason="no"))
    assert registry.select_backend(None, environ={}) is CPU


# ---- errors ---------------------------------------------------------------------------------------------------
def test_unknown_backend_lists_the_known_ones(entry_points):
    entry_points(acme=_fake("acme"))
    with pytest.raises(BackendUnavailableError) as err:
        registry.select_backend("tpu", environ={})
    assert isinstance(err.value, ValueError)
    assert "unknown backend 'tpu'" in str(err.value)
    assert re.search(r"known: acme, cpu, cuda, musa\b", str(err.value)), str(err.value)
    with pytest.raises(BackendUnavailableError, match="unknown backend 'tpu'"):
        registry.select_backend(None, environ={registry.ENV_VAR: "tpu"})


def test_cuda_requested_without_cuda(entry_points, monkeypatch):
    monkeypatch.setattr(torch.version, "cuda", None)
    with pytest.raises(BackendUnavailableError, match=r"^cuda requested but this torch .* was built without CUDA"):
        registry.select_backend("cuda", environ={})
    base._cached_missing.cache_clear()
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    with pytest.raises(BackendUnavailableError, match=r"^cuda requested but no CUDA device is visible"):
        registry.select_backend("cuda", environ={})
    base._cached_missing.cache_clear()
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert registry.select_backend("cuda", environ={}) is CUDA
    monkeypatch.setattr(registry, "MUSA", _fake("musa", reason="not here"))
    assert registry.select_backend(None, environ={}) is CUDA, "auto-detect must take cuda when it has devices"


def _simulate_musa_install(monkeypatch, *, torch_musa: bool, torchada: bool, num_devices: int = 0):
    real_find_spec = importlib.util.find_spec
    present = {"torch_musa": torch_musa, "torchada": torchada}

    def find_spec(name, *args, **kwargs):
        if name in present:
            return importlib.machinery.ModuleSpec(name, None) if present[name] else None
        return real_find_spec(name, *args, **kwargs)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    if torch_musa:
        monkeypatch.setitem(sys.modules, "torch_musa", types.ModuleType("torch_musa"))
        monkeypatch.setattr(torch, "musa", types.SimpleNamespace(device_count=lambda: num_devices), raising=False)


def test_musa_requested_without_torch_musa(entry_points, monkeypatch):
    _simulate_musa_install(monkeypatch, torch_musa=False, torchada=True)
    with pytest.raises(BackendUnavailableError, match=r"^musa requested but torch_musa is not installed"):
        registry.select_backend("musa", environ={})


def test_musa_with_torch_musa_but_no_torchada_names_torchada(entry_points, monkeypatch):
    _simulate_musa_install(monkeypatch, torch_musa=True, torchada=False, num_devices=8)
    with pytest.raises(BackendUnavailableError, match=r"^musa requested but torchada is not installed"):
        registry.select_backend("musa", environ={})


def test_musa_without_devices_and_musa_auto_detected(entry_points, monkeypatch):
    _simulate_musa_install(monkeypatch, torch_musa=True, torchada=True, num_devices=0)
    with pytest.raises(BackendUnavailableError, match=r"^musa requested but torch_musa sees no MUSA device"):
        registry.select_backend("musa", environ={})
    base._cached_missing.cache_clear()
    _simulate_musa_install(monkeypatch, torch_musa=True, torchada=True, num_devices=8)
    assert registry.select_backend(None, environ={}) is MUSA, "auto-detect must prefer musa when it has devices"


def test_entry_point_that_is_not_a_backend_raises_type_error(entry_points):
    entry_points(broken={"name": "broken"})
    with pytest.raises(TypeError, match="broken"):
        registry.select_backend(None, environ={})
    with pytest.raises(TypeError, match="not an mtmegatron Backend"):
        registry.known_backends()


# ---- the description's data --------------------------------------------------------------------------------
def test_dist_backend_comes_from_torch_registry(monkeypatch):
    assert CPU.dist_backend == dist.Backend.default_device_backend_map["cpu"]
    fake = _fake("acme")
    with pytest.raises(BackendUnavailableError, match="no collective backend registered for device 'acme'"):
        _ = fake.dist_backend
    monkeypatch.setitem(dist.Backend.default_device_backend_map, "acme", "acmeccl")
    assert fake.dist_backend == "acmeccl"
    monkeypatch.setitem(dist.Backend.default_device_backend_map, "cpu", "acmeccl")
    assert CPU.dist_backend == "acmeccl", "dist_backend must be read from torch, not hard-coded"


def test_device_module_is_torchs(backend):
    assert backend.device_module() is torch.get_device_module(backend.device_type)
    assert backend.device(0).type == backend.device_type


# REFERENCE.md, "MUSA env seen in MT-MegatronLM launchers" (transcribed; re-read below when the file is around)
_REFERENCE_MUSA_ENV = {
    "MUSA_KERNEL_TIMEOUT": "3200000", "MCCL_PROTOS": "2", "MCCL_CHECK_POINTERS": "0", "MCCL_ALGOS": "1",
    "MCCL_BUFFSIZE": "20480000", "MCCL_IB_GID_INDEX": "3", "MUSA_BLOCK_SCHEDULE_MODE": "1",
    "CUDA_DEVICE_MAX_CONNECTIONS": "1", "OMP_NUM_THREADS": "4",
}
_REFERENCE_PATHS = [pathlib.Path(__file__).resolve().parents[2] / "REFERENCE.md", pathlib.Path("/work/shared/REFERENCE.md")]


def test_musa_env_names_match_reference():
    assert MUSA.visible_devices_env == "MUSA_VISIBLE_DEVICES"
    assert CUDA.visible_devices_env == "CUDA_VISIBLE_DEVICES"
    assert CPU.visible_devices_env is None
    assert MUSA_ENV_DEFAULTS == _REFERENCE_MUSA_ENV
    reference = next((p for p in _REFERENCE_PATHS if p.is_file()), None)
    if reference is None:
        return
    text = reference.read_text()
    section = text[text.index("MUSA env seen in MT-MegatronLM launchers"):]
    section = section[: section.index("\n\n")]
    assert "MUSA_VISIBLE_DEVICES" in section
    assert dict(re.findall(r"([A-Z_]+)=(\d+)", section)) == _REFERENCE_MUSA_ENV
