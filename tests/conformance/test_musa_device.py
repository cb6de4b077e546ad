"""MUSA device decisions with the device faked (backends/musa_device.py, visible_devices.sync_max_connections):
arch numbers, bf16 refused below arch 220 with one line, FP8 ``_scaled_mm`` from arch 310, the TF32 rule (full
FP32 unless asked, as Megatron-LM on CUDA) and MUSA_DEVICE_MAX_CONNECTIONS beside CUDA's. None of this has run on
MUSA hardware."""

from __future__ import annotations

import argparse
from types import SimpleNamespace

import pytest

from mtmegatron.backends import musa_device, visible_devices

S80, S4000, S5000 = (2, 1), (2, 2), (3, 1)


class FakeError(ValueError):
    pass


def _musa(*capabilities):
    """A torch.musa stand-in whose device i has capabilities[i]."""
    return SimpleNamespace(get_device_capability=lambda i=0: capabilities[i], device_count=lambda: len(capabilities),
                           torch_musa_version="2.11.0.post1")


def _backends(allow_tf32=None):
    matmul = SimpleNamespace() if allow_tf32 is None else SimpleNamespace(allow_tf32=allow_tf32)
    return SimpleNamespace(musa=SimpleNamespace(matmul=matmul))


def test_arch_numbers_and_capabilities():
    assert [musa_device.arch_number(c) for c in (S80, S4000, S5000)] == [210, 220, 310]
    assert [musa_device.supports_bf16(a) for a in (210, 220, 310)] == [False, True, True]
    assert [musa_device.supports_scaled_mm(a) for a in (210, 220, 310)] == [False, False, True]
    assert musa_device.device_arch(1, _musa(S4000, S5000)) == 310


@pytest.mark.parametrize("capability,refused", [(S80, True), (S4000, False), (S5000, False)])
def test_bf16_is_refused_with_one_line_only_without_bf16(capability, refused):
    args = argparse.Namespace(bf16=True)
    if refused:
        with pytest.raises(FakeError) as info:
            musa_device.check_precision_args(args, FakeError, local_rank=0, musa=_musa(capability))
        message = str(info.value)
        assert "\n" not in message and message.startswith("--bf16:") and "arch 210" in message and "220" in message
    else:
        musa_device.check_precision_args(args, FakeError, local_rank=0, musa=_musa(capability))
    musa_device.check_precision_args(argparse.Namespace(bf16=False), FakeError, 0, _musa(capability))  # fp32: fine


def test_bf16_check_asks_the_device_of_this_rank(monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "1")
    with pytest.raises(FakeError):
        musa_device.check_precision_args(argparse.Namespace(bf16=True), FakeError, musa=_musa(S4000, S80))


@pytest.mark.parametrize("env,precision,wanted", [
    ({}, "highest", False),                                            # torch's default: full FP32, as on CUDA
    ({musa_device.TF32_ENV: "1"}, "highest", True),                    # MUSA's own switch
    ({}, "high", True),                                                # torch.set_float32_matmul_precision("high")
    ({musa_device.TF32_ENV: "0"}, "highest", False),
])
def test_tf32_follows_the_cuda_rule(env, precision, wanted):
    backends = _backends(allow_tf32=not wanted)  # start from the opposite, e.g. a release that defaulted to TF32
    state = musa_device.apply_tf32_rule(env, backends, precision)
    try:
        assert backends.musa.matmul.allow_tf32 is wanted
        assert state.startswith("tf32: on" if wanted else "tf32: off"), state
    finally:
        musa_device.restore_tf32()
    assert backends.musa.matmul.allow_tf32 is (not wanted)  # the bridge's uninstall puts it back


def test_tf32_without_the_switch_says_so():
    state = musa_device.apply_tf32_rule({}, _backends(allow_tf32=None), "highest")
    assert "no torch.backends.musa.matmul.allow_tf32" in state and "off wanted" in state
    assert musa_device.apply_tf32_rule({}, SimpleNamespace(), "highest").startswith("tf32: this torch_musa has no")


@pytest.mark.parametrize("capability,bf16,fp8", [(S80, "no", "no"), (S4000, "yes", "no"), (S5000, "yes", "yes")])
def test_doctor_lines_report_arch_bf16_fp8_and_tf32(capability, bf16, fp8):
    lines = musa_device.capability_lines(0, _musa(capability), {}, _backends(allow_tf32=False))
    text = "\n".join(lines)
    assert "torch_musa 2.11.0.post1" in lines[0]
    assert f"arch {musa_device.arch_number(capability)}" in lines[1]
    assert f"bf16: {bf16}" in text and f"fp8 torch._scaled_mm: {fp8}" in text
    assert "tf32: off" in text


def test_max_connections_follow_cuda_unless_musa_is_set():
    env = {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}
    assert visible_devices.sync_max_connections(env) == {"MUSA_DEVICE_MAX_CONNECTIONS": "1"}
    assert env["MUSA_DEVICE_MAX_CONNECTIONS"] == "1"
    env = {"CUDA_DEVICE_MAX_CONNECTIONS": "1", "MUSA_DEVICE_MAX_CONNECTIONS": "8"}
    assert visible_devices.sync_max_connections(env) == {} and env["MUSA_DEVICE_MAX_CONNECTIONS"] == "8"
    assert visible_devices.sync_max_connections({}) == {}
