"""megatron-core's ``jit_fuser`` compiles a helper on its first call, not while megatron-core imports
(utils/deferred_imports.py): importing it starts no TorchDynamo, and a helper still gives its plain result,
compiled once."""

from __future__ import annotations

import subprocess
import sys

import torch

from mtmegatron.utils import deferred_imports

FRESH_IMPORT = """
import sys
import mtmegatron, megatron.core.jit, megatron.core.models.gpt, megatron.core.distributed, megatron.core.optimizer
from megatron.core.fusions import fused_bias_gelu
from mtmegatron.utils.deferred_imports import compile_on_first_call
assert megatron.core.jit.jit_fuser is compile_on_first_call, megatron.core.jit.jit_fuser
assert fused_bias_gelu.bias_gelu.__wrapped__.__name__ == "bias_gelu"
print("dynamo imported:", "torch._dynamo" in sys.modules)
"""


def test_importing_megatron_core_after_mtmegatron_starts_no_dynamo():
    out = subprocess.run([sys.executable, "-c", FRESH_IMPORT], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "dynamo imported: False" in out.stdout


def test_a_deferred_helper_compiles_once_on_first_call_and_equals_the_plain_function(monkeypatch):
    compiled_calls = []
    real_compile = torch.compile

    def counting_compile(fn, *args, **kwargs):
        compiled_calls.append(fn)
        return real_compile(fn, *args, backend="eager", **kwargs)  # eager: no C++ compiler needed on the CPU

    monkeypatch.setattr(torch, "compile", counting_compile)

    def gelu_bias(x, b):
        return torch.nn.functional.gelu(x + b)

    helper = deferred_imports.compile_on_first_call(gelu_bias)
    assert compiled_calls == [] and helper.__wrapped__ is gelu_bias
    x, b = torch.randn(4, 8), torch.randn(8)
    assert torch.equal(helper(x, b), gelu_bias(x, b))
    assert torch.equal(helper(x, b), gelu_bias(x, b))
    assert compiled_calls == [gelu_bias]


def test_only_megatrons_torch_compile_choice_is_replaced():
    class Jit:
        jit_fuser = torch.compile

    deferred_imports.defer(Jit)
    assert Jit.jit_fuser is deferred_imports.compile_on_first_call

    def noop(fn):
        return fn

    class Disabled:
        jit_fuser = noop

    deferred_imports.defer(Disabled)
    assert Disabled.jit_fuser is noop
