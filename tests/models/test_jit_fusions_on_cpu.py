"""megatron-core's jit fusions (``torch.compile``d: bias-dropout-add, bias-SwiGLU) compile and run under the cpu
bridge, where ``torch.cuda`` is the host's device module (bridge/cpu_device.py): inductor keys its compile cache
with ``torch.cuda.get_device_properties`` and read an attribute the stand-in lacked, so with
``MTMEGATRON_CPU_JIT_FUSIONS=1`` every run died at the first step. A subprocess (its own bridge, its own inductor
cache): one cold compile of each function, ~10-20 s on 2 cores.
"""

from __future__ import annotations

import os
import subprocess
import sys

_CHILD = r"""
import torch
import mtmegatron

mtmegatron.activate("cpu")
from megatron.core.fusions.fused_bias_dropout import bias_dropout_add_fused_train
from megatron.core.fusions.fused_bias_swiglu import bias_swiglu_impl
from torch._inductor.codecache import CacheBase

CacheBase.get_system.cache_clear()
assert CacheBase.get_system()["device"] == {"name": "cpu"}, CacheBase.get_system()
torch.manual_seed(0)
x, residual, bias = torch.randn(4, 2, 8), torch.randn(4, 2, 8), torch.randn(8)
out = bias_dropout_add_fused_train((x, bias), residual, 0.0)
assert torch.allclose(out, x + bias + residual, atol=1e-6), (out - (x + bias + residual)).abs().max()
y = torch.randn(4, 2, 16, requires_grad=True)
got = bias_swiglu_impl(y, None)
a, b = y.detach().chunk(2, dim=-1)
assert torch.allclose(got, torch.nn.functional.silu(a) * b, atol=1e-6)
got.sum().backward()
assert y.grad is not None and y.grad.shape == y.shape
print("jit fusions ran")
"""


def test_megatron_jit_fusions_compile_and_run_under_the_cpu_bridge(tmp_path):
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"), "OMP_NUM_THREADS": "1"}
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(var, None)
    done = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0 and "jit fusions ran" in done.stdout, done.stderr[-4000:]
