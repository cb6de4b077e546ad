"""Quantized GEMMs of the FP8 linear (forward, dgrad, wgrad) per recipe and executor vs the fp32 GEMM on
random data: relative error (Frobenius) within the bound a format's mantissa allows, and above a floor so a
GEMM that silently ran in full precision fails; the scaled_mm executor agrees with the emulated reference for
the tensor-scaled recipes (the block-scaled ones run emulated on the CPU: tests/fp8/test_fp8_probe.py)."""

from __future__ import annotations

import pytest
import torch

from mtmegatron.fp8.linear import Fp8Runtime, _Fp8Linear
from mtmegatron.fp8.recipes import BlockwiseScaling, DelayedScaling, MXFP8Scaling, TensorwiseScaling

RECIPES = {"delayed": DelayedScaling, "tensorwise": TensorwiseScaling, "blockwise": BlockwiseScaling,
           "mxfp8": MXFP8Scaling}
# upper bounds on the relative error: E4M3 x E4M3 (3 mantissa bits) forward; E5M2 (2 bits) gradients in hybrid
BOUND = {"e4m3": 0.05, "e5m2": 0.09}
FLOOR = 1e-3
TENSOR_SCALED = ("delayed", "tensorwise")  # the recipes torch._scaled_mm runs on the CPU


def rel(a, b):
    return ((a - b).norm() / b.norm()).item()


def run(recipe, executor, x, w, dy, warmups=1):
    fp8 = Fp8Runtime(recipe, executor, group=None, device="cpu")
    for step in range(warmups + 1):  # delayed scaling: the first call runs with scale 1 and fills the history
        xg, wg = x.clone().requires_grad_(), w.clone().requires_grad_()
        y = _Fp8Linear.apply(xg, wg, None, fp8, False, False, None)
        y.backward(dy)
    return y.detach(), xg.grad, wg.grad


@pytest.fixture(scope="module")
def data():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(96, 200, generator=g)  # K = 200: partial 128- and 32-blocks
    w = torch.randn(72, 200, generator=g) * 0.05
    dy = torch.randn(96, 72, generator=g) * 1e-3
    ref = (x @ w.t(), dy @ w, dy.t() @ x)
    return x, w, dy, ref


@pytest.mark.parametrize("fmt", ["hybrid", "e4m3"])
@pytest.mark.parametrize("name", list(RECIPES))
def test_fp8_gemm_error_bounds(name, fmt, data, record_property):
    x, w, dy, ref = data
    recipe = RECIPES[name](fp8_format=fmt)
    emulated = run(recipe, "emulated", x, w, dy)
    grad_fmt = "e5m2" if fmt == "hybrid" else "e4m3"
    errors = [rel(got, want) for got, want in zip(emulated, ref)]
    record_property("rel_error_fwd_dgrad_wgrad", errors)
    print(f"{name} {fmt}: fwd {errors[0]:.4f} dgrad {errors[1]:.4f} wgrad {errors[2]:.4f}")
    assert FLOOR < errors[0] < BOUND["e4m3"]
    assert FLOOR < errors[1] < BOUND[grad_fmt] and FLOOR < errors[2] < BOUND[grad_fmt]
    if name in TENSOR_SCALED:
        for a, b in zip(run(recipe, "scaled_mm", x, w, dy), emulated):  # same products, fp32 summation order differs
            assert rel(a, b) < 1e-5


def test_block_scaling_keeps_small_rows_that_tensor_scaling_flushes():
    """Rows of the input spread over 2^-14..2^4: one per-tensor scale pushes the small rows into E4M3's
    subnormal range (or to zero), per-block scales do not. Worst per-row relative forward error."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(64, 256, generator=g) * torch.exp2(torch.linspace(-14, 4, 64)).unsqueeze(1)
    w = torch.randn(64, 256, generator=g) * 0.05
    dy = torch.randn(64, 64, generator=g)
    ref = x @ w.t()
    worst = {}
    for name in ("tensorwise", "blockwise", "mxfp8"):
        y = run(RECIPES[name](fp8_format="hybrid"), "scaled_mm" if name in TENSOR_SCALED else "emulated", x, w, dy)[0]
        worst[name] = ((y - ref).norm(dim=1) / ref.norm(dim=1)).max().item()
    print(f"worst per-row fwd error: {worst}")
    assert worst["blockwise"] < 0.08 and worst["mxfp8"] < 0.08  # the worst of 64 rows, so above the mean bound
    assert worst["tensorwise"] > 0.5
