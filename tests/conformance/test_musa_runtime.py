"""MUSA runtime policy: TorchDynamo is disabled unless MTMEGATRON_MUSA_DYNAMO=1, reversibly (runs on the CPU;
the policy has nothing device-specific)."""
from __future__ import annotations

import pytest
import torch
import torch._dynamo.config as dynamo_config

from mtmegatron.backends import musa_runtime


@pytest.fixture(autouse=True)
def _clean():
    original = dynamo_config.disable
    musa_runtime._previous.clear()
    yield
    musa_runtime._previous.clear()
    dynamo_config.disable = original


def test_disables_dynamo_and_restores_the_previous_value():
    dynamo_config.disable = False
    assert musa_runtime.disable_dynamo_unless_requested({}) is True
    assert dynamo_config.disable is True
    assert musa_runtime.disable_dynamo_unless_requested({}) is True  # idempotent: remembers the first value
    musa_runtime.restore()
    assert dynamo_config.disable is False
    musa_runtime.restore()  # nothing left to restore
    assert dynamo_config.disable is False


def test_compiled_functions_run_eagerly_when_disabled():
    calls = []

    def f(x):
        calls.append(torch.compiler.is_compiling())
        return x * 2

    musa_runtime.disable_dynamo_unless_requested({})
    compiled = torch.compile(f, backend="eager")
    assert torch.equal(compiled(torch.ones(3)), torch.full((3,), 2.0))
    assert calls == [False], "with dynamo disabled the function must not be traced"


@pytest.mark.parametrize("value", ["1", "true", "YES"])
def test_user_can_keep_dynamo(value):
    dynamo_config.disable = False
    assert musa_runtime.disable_dynamo_unless_requested({musa_runtime.ENV_VAR: value}) is False
    assert dynamo_config.disable is False


def test_bad_value_is_a_clear_error():
    with pytest.raises(ValueError, match=r"MTMEGATRON_MUSA_DYNAMO='maybe': expected 1"):
        musa_runtime.disable_dynamo_unless_requested({musa_runtime.ENV_VAR: "maybe"})
    assert musa_runtime.disable_dynamo_unless_requested({musa_runtime.ENV_VAR: "0"}) is True
