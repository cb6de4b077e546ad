"""Conformance: megatron-core version guard and the version-guarded patches (targets exist, apply/revert)."""

from __future__ import annotations

import sys
import types

import pytest

from mtmegatron import patches
from helpers.patch_state import no_backend_around_the_test  # noqa: F401 (autouse)
from mtmegatron.backends.cpu import CPU
from mtmegatron.patches import base as patch_base

_MISSING = object()


def _current(owner, name):
    return vars(owner).get(name, _MISSING) if hasattr(owner, "__dict__") else getattr(owner, name, _MISSING)


def test_unsupported_megatron_is_refused_with_range_and_override():
    with pytest.raises(patches.UnsupportedMegatronVersion) as err:
        patches.check_megatron_version("0.15.0", environ={})
    message = str(err.value)
    assert isinstance(err.value, ValueError)
    assert "0.15.0" in message and patches.SUPPORTED_MEGATRON in message and patches.FORCE_ENV in message
    with pytest.raises(patches.UnsupportedMegatronVersion):
        patches.check_megatron_version("0.17.0", environ={})
    with pytest.raises(patches.UnsupportedMegatronVersion):
        patches.check_megatron_version("0.15.0", environ={patches.FORCE_ENV: "0"})
    assert patches.check_megatron_version("0.15.0", environ={patches.FORCE_ENV: "1"}) == "0.15.0"
    assert patches.check_megatron_version("0.16.0", environ={}) == "0.16.0"


def test_installed_megatron_is_supported():
    import megatron.core

    version = patches.check_megatron_version(environ={})
    assert version == megatron.core.package_info.__version__


def test_every_patch_targets_installed_megatron_and_reverts_exactly():
    found = patches.all_patches()
    assert found, "no patches discovered under mtmegatron.patches"
    names = [p.name for p in found]
    assert len(names) == len(set(names)), f"duplicate patch names: {names}"
    version = patches.megatron_version()
    for patch in found:
        assert patch.reason and patch.versions, patch.name
        owner, attr = patch_base.resolve(patch.target)  # imports the target's module in this megatron-core
        assert any(patch.applies(version, b) for b in patch.backends), f"{patch.name} is dead for {version}"
        before = _current(owner, attr)
        undo = patch.apply()
        after_apply = _current(owner, attr)
        undo()
        assert _current(owner, attr) is before, f"{patch.name}: revert did not restore {patch.target}"
        if before is _MISSING:
            assert after_apply is not _MISSING, f"{patch.name} binds nothing at {patch.target}"


def test_apply_all_and_revert_all_roundtrip():
    targets = {p.target: _current(*patch_base.resolve(p.target)) for p in patches.all_patches()}
    try:
        applied = patches.apply_all(CPU)
        assert [p.name for p in patches.applied()] == [p.name for p in applied]
        assert {p.name for p in applied} == {
            p.name for p in patches.all_patches() if p.applies(patches.megatron_version(), "cpu")
        }
        assert patches.apply_all(CPU) == applied, "apply_all twice must not stack patches"
    finally:
        patches.revert_all()
    assert patches.applied() == []
    for target, before in targets.items():
        assert _current(*patch_base.resolve(target)) is before, f"revert_all left {target} changed"


def test_moe_router_gemm_patch_binds_te_general_gemm_when_te_is_absent():
    moe_utils = pytest.importorskip("megatron.core.transformer.moe.moe_utils")
    if "te_general_gemm" in vars(moe_utils) and vars(moe_utils)["te_general_gemm"] is not None:
        pytest.skip("TransformerEngine provides te_general_gemm here; the patch is a no-op")
    patch = next(p for p in patches.all_patches() if p.name == "moe_router_gemm_without_te")
    undo = patch.apply()
    try:
        assert moe_utils.te_general_gemm is None  # the torch.mm path of RouterGatingLinearFunction
    finally:
        undo()
    assert "te_general_gemm" not in vars(moe_utils)


def test_set_attr_refuses_a_vanished_target(monkeypatch):
    module = types.ModuleType("_mtmegatron_fake_target")
    module.present = 1
    monkeypatch.setitem(sys.modules, module.__name__, module)
    with pytest.raises(patch_base.PatchTargetMissing, match="_mtmegatron_fake_target:gone"):
        patch_base.set_attr(f"{module.__name__}:gone", 2)
    undo = patch_base.set_attr(f"{module.__name__}:present", 2)
    assert module.present == 2
    undo()
    assert module.present == 1


def test_megatron_fsdp_param_gather_is_synchronous_on_gloo(monkeypatch):
    """The cpu backend's Megatron-FSDP parameter all-gather runs with ``async_param_gather=False`` whichever way
    the caller passes it (megatron-core's hooks pass keywords; the fifth positional slot is the same parameter)."""
    import inspect

    buffer = pytest.importorskip("megatron.core.distributed.fsdp.src.megatron_fsdp.param_and_grad_buffer")
    pipeline = buffer.AllGatherPipeline
    assert list(inspect.signature(pipeline.all_gather_params).parameters)[:6] == [
        "self", "params", "prefetch", "prefetch_order", "suggested_AG_prefetch_size", "async_param_gather"]
    calls = []
    monkeypatch.setattr(pipeline, "all_gather_params", lambda self, params, *a, **k: calls.append((params, a, k)))
    patch = next(p for p in patches.all_patches() if p.name == "megatron_fsdp_gloo_sync_param_gather")
    assert patch.backends == ("cpu",)
    undo = patch.apply()
    try:
        pipeline.all_gather_params(None, ["p"], prefetch=True, bwd=True)
        pipeline.all_gather_params(None, ["p"], True, "order", 7, True, False)
    finally:
        undo()
    assert calls == [(["p"], (), {"prefetch": True, "bwd": True, "async_param_gather": False}),
                     (["p"], (True, "order", 7, False, False), {})]
