"""Conformance: backend selection (``--backend`` > MTMEGATRON_BACKEND > entry points > auto-detect) and its
errors, in-process with a fake environ, fake entry points and a simulated torch_musa/torchada/CUDA.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import pathlib
import re
import subprocess
import sys
import types
import warnings
from dataclasses import dataclass

import pytest
import torch
import torch.distributed as dist

from mtmegatron.backends import Absent, Backend, BackendUnavailableError, base, registry, visible_devices
from mtmegatron.backends import musa as musa_backend
from mtmegatron.backends.cpu import CPU
from mtmegatron.backends.cuda import CUDA
from mtmegatron.backends.musa import MCCL_CLUSTER_PROFILES, MUSA, MUSA_ENV_DEFAULTS


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
    monkeypatch.setattr(registry, "MUSA", _fake("musa", reason="no"))  # a MUSA device here (the simulator) aside
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


def _unset_until_teardown(monkeypatch, var: str) -> None:
    """Unset ``var`` and restore its original state (set or unset) at teardown, also when the code under test
    sets it meanwhile (a bare ``delenv`` of an unset variable records nothing to undo, so the value the probe
    writes would leak into later tests: the simulated-MUSA lane then saw 2 devices)."""
    monkeypatch.setenv(var, "")
    monkeypatch.delenv(var)


def _simulate_musa_install(monkeypatch, *, torch_musa: bool, torchada: bool, num_devices: int = 0):
    for var in ("MUSA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"):  # the probe syncs them; keep the real env
        _unset_until_teardown(monkeypatch, var)
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
    with pytest.raises(BackendUnavailableError, match=r"^musa requested but torch_musa is installed but torchada is not"
                       r".*pip install torchada"):
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
    profile = MCCL_CLUSTER_PROFILES["mt-deepseek"]
    # + MUSA_DEVICE_MAX_CONNECTIONS next to CUDA's (REFERENCE.md: other MUSA Megatron launchers set both; torchada
    # does not translate it)
    assert {**MUSA_ENV_DEFAULTS, **profile} == {**_REFERENCE_MUSA_ENV, "MUSA_DEVICE_MAX_CONNECTIONS": "1"}, \
        "defaults + the cluster profile = MT's launchers"
    reference = next((p for p in _REFERENCE_PATHS if p.is_file()), None)
    if reference is None:
        return
    text = reference.read_text()
    section = text[text.index("MUSA env seen in MT-MegatronLM launchers"):]
    section = section[: section.index("\n\n")]
    assert "MUSA_VISIBLE_DEVICES" in section
    assert dict(re.findall(r"([A-Z_]+)=(\d+)", section)) == _REFERENCE_MUSA_ENV


def test_cluster_specific_mccl_settings_are_opt_in():
    cluster_only = {"MCCL_IB_GID_INDEX", "MCCL_ALGOS", "MCCL_BUFFSIZE", "MCCL_PROTOS", "MUSA_BLOCK_SCHEDULE_MODE",
                    "MCCL_CHECK_POINTERS"}
    assert not cluster_only & MUSA_ENV_DEFAULTS.keys()
    assert musa_backend.launch_env({}) == MUSA_ENV_DEFAULTS
    opted = musa_backend.launch_env({musa_backend.PROFILE_ENV: "mt-deepseek"})
    assert cluster_only <= opted.keys() and opted["MCCL_IB_GID_INDEX"] == "3"
    with pytest.raises(ValueError, match="'mt-dsv3' is not a known MCCL cluster profile .known: mt-deepseek"):
        musa_backend.launch_env({musa_backend.PROFILE_ENV: "mt-dsv3"})


# ---- no silent fallbacks -------------------------------------------------------------------------------------
def test_torch_musa_without_torchada_stops_auto_detect_with_the_fix(entry_points, monkeypatch):
    _simulate_musa_install(monkeypatch, torch_musa=True, torchada=False, num_devices=8)
    with pytest.raises(BackendUnavailableError) as err:
        registry.select_backend(None, environ={})
    message = str(err.value)
    assert message.startswith("auto-detect stopped at musa: torch_musa is installed but torchada is not")
    assert "pip install torchada" in message and "bash scripts/install.sh" in message and "--backend cpu" in message
    assert registry.select_backend("cpu", environ={}) is CPU, "an explicit --backend cpu still works"
    assert registry.select_backend(None, environ={registry.ENV_VAR: "cpu"}) is CPU
    assert "torch_musa" not in sys.modules or isinstance(sys.modules["torch_musa"], types.ModuleType)


def test_auto_detect_says_why_an_installed_backend_was_skipped(entry_points, monkeypatch):
    _simulate_musa_install(monkeypatch, torch_musa=True, torchada=True, num_devices=0)
    with pytest.warns(UserWarning, match=r"auto-detect chose cpu; skipped musa: torch_musa sees no MUSA device"):
        assert registry.select_backend(None, environ={}) is CPU


def test_auto_detect_is_quiet_about_backends_that_are_not_installed(entry_points, monkeypatch):
    _simulate_musa_install(monkeypatch, torch_musa=False, torchada=False)
    monkeypatch.setattr(registry, "CUDA", _fake("cuda", reason=Absent("this torch was built without CUDA")))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert registry.select_backend(None, environ={}) is CPU


def test_explain_selection_lists_every_backend_with_its_reason(entry_points, monkeypatch):
    entry_points(acme=_fake("acme", reason="the acme driver is not loaded"))
    _simulate_musa_install(monkeypatch, torch_musa=True, torchada=True, num_devices=0)
    monkeypatch.setattr(registry, "CUDA", _fake("cuda", reason=Absent("built without CUDA")))
    chosen, rows = registry.explain_selection(None, environ={})
    assert chosen is CPU
    assert rows == [("acme", "the acme driver is not loaded"),
                    ("musa", "torch_musa sees no MUSA device (check MUSA_VISIBLE_DEVICES and the driver)"),
                    ("cuda", "built without CUDA"), ("cpu", None)]
    assert registry.how_selected(None, {}) == "auto-detect"
    assert registry.how_selected(None, {registry.ENV_VAR: "cpu"}) == registry.ENV_VAR
    assert registry.how_selected("cpu", {}) == "--backend"


# ---- visible devices: synced before torch_musa is imported ---------------------------------------------------
_FAKE_TORCH_MUSA = """
import os
import types

import torch

SEEN_MUSA_VISIBLE_DEVICES = os.environ.get("MUSA_VISIBLE_DEVICES", "<unset>")
torch.musa = types.SimpleNamespace(device_count=lambda: 2)
"""


def test_visible_devices_are_synced_before_torch_musa_is_imported(entry_points, monkeypatch, tmp_path):
    (tmp_path / "torch_musa").mkdir()
    (tmp_path / "torch_musa/__init__.py").write_text(_FAKE_TORCH_MUSA)
    (tmp_path / "torchada").mkdir()
    (tmp_path / "torchada/__init__.py").write_text("raise AssertionError('the probe must not import torchada')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "torch_musa", raising=False)
    monkeypatch.setattr(torch, "musa", None, raising=False)
    _unset_until_teardown(monkeypatch, "MUSA_VISIBLE_DEVICES")  # the probe sets it: undone at teardown
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    assert registry.select_backend("musa", environ={}) is MUSA
    assert sys.modules["torch_musa"].SEEN_MUSA_VISIBLE_DEVICES == "3,5"


@pytest.mark.parametrize("before,after", [
    ({"CUDA_VISIBLE_DEVICES": "1"}, {"CUDA_VISIBLE_DEVICES": "1", "MUSA_VISIBLE_DEVICES": "1"}),
    ({"MUSA_VISIBLE_DEVICES": "2", "CUDA_VISIBLE_DEVICES": "1"}, {"MUSA_VISIBLE_DEVICES": "2", "CUDA_VISIBLE_DEVICES": "2"}),
    ({"MUSA_VISIBLE_DEVICES": ""}, {"MUSA_VISIBLE_DEVICES": "", "CUDA_VISIBLE_DEVICES": ""}),
    ({}, {}),
])
def test_visible_devices_rule_is_torchadas(before, after, monkeypatch):
    monkeypatch.delitem(sys.modules, "torch_musa", raising=False)
    environ = dict(before)
    visible_devices.sync(environ)
    assert environ == after


def test_a_late_sync_warns(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch_musa", types.ModuleType("torch_musa"))
    with pytest.warns(UserWarning, match="after torch_musa was imported"):
        visible_devices.sync({"CUDA_VISIBLE_DEVICES": "0"})


_SPY = """
import os, sys
seen = []
class Spy:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" and not seen:
            seen.append(os.environ.get("MUSA_VISIBLE_DEVICES", "<unset>"))
        return None
sys.meta_path.insert(0, Spy())
import mtmegatron.backends
print(seen[0], os.environ.get("MUSA_VISIBLE_DEVICES"))
"""


def test_importing_mtmegatron_syncs_before_torch_is_imported(tmp_path):
    """torch may autoload torch_musa during `import torch`; the sync must come first (a fresh interpreter)."""
    (tmp_path / "torch_musa").mkdir()
    (tmp_path / "torch_musa/__init__.py").write_text("")
    env = {k: v for k, v in os.environ.items() if k != "MUSA_VISIBLE_DEVICES"}
    env.update(CUDA_VISIBLE_DEVICES="4,6", PYTHONPATH=os.pathsep.join([str(tmp_path), env.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-c", _SPY], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["4,6", "4,6"]
    del env["PYTHONPATH"]  # no torch_musa: nothing is touched
    proc = subprocess.run([sys.executable, "-c", _SPY], capture_output=True, text=True, env=env, timeout=120)
    assert proc.stdout.split() == ["<unset>", "None"], proc.stderr


def test_env_command_lists_the_choice_and_reasons(entry_points, monkeypatch, capsys):
    from mtmegatron import cli

    _simulate_musa_install(monkeypatch, torch_musa=True, torchada=True, num_devices=0)
    assert cli.main(["env"]) == 0
    out = capsys.readouterr().out
    assert "musa  device=musa  kernels=PrivateUse1 unavailable: torch_musa sees no MUSA device" in out
    assert "selected: cpu by auto-detect (collectives: gloo); passed over musa, cuda (reasons above)" in out
    assert "native kernels on cpu: " in out
    base._cached_missing.cache_clear()
    _simulate_musa_install(monkeypatch, torch_musa=True, torchada=False)
    assert cli.main(["env"]) == 2
    out = capsys.readouterr().out
    assert "unavailable: torch_musa is installed but torchada is not" in out
    assert "selected: none: auto-detect stopped at musa" in out and "pip install torchada" in out
