"""FP8 quantize/dequantize ops of every recipe against the independent float64 model in fp8_reference.py:
scales, rounding, saturation at 448/57344, zero and non-finite amax, E8M0 rounding up, power-of-2 block scales
and partial blocks on shapes that are not multiples of the block; plus the ops' registration (opcheck) and
the delayed-scaling state (history, algorithms, margin, checkpoint round trip)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from fp8_reference import (FORMATS, block_amax, blockwise_scale, e8m0_exponent, expand, pow2_floor,
                           round_to_fp8)

from mtmegatron.fp8.quantize import (fp8_dequantize, fp8_quantize_blockwise, fp8_quantize_current,
                                     fp8_quantize_mxfp8, fp8_quantize_scaled)
from mtmegatron.fp8.recipes import DelayedScaling
from mtmegatron.fp8.state import DelayedScalingState

DTYPES = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}


def wide_range(rows, cols, seed=0):
    """Values spread over ~12 binades so blocks get different scales and some values go subnormal."""
    g = torch.Generator().manual_seed(seed)
    mag = torch.exp2(torch.randint(-8, 4, (rows, cols), generator=g).float())
    return torch.randn(rows, cols, generator=g) * mag


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_tensorwise_current_scaling(fmt):
    x = wide_range(37, 50)
    data, scale_inv = fp8_quantize_current(x, DTYPES[fmt])
    xd = x.double().numpy()
    fmax = FORMATS[fmt][2]
    scale = fmax / np.abs(xd).max()
    assert scale_inv.item() == pytest.approx(1 / scale, rel=1e-6)
    ref = round_to_fp8(xd * np.float32(1 / scale_inv.item()), fmt)  # same fp32 scale, float64 rounding
    np.testing.assert_array_equal(data.double().numpy(), ref)
    assert data.double().abs().max().item() == fmax  # the amax element lands exactly on the format maximum


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_delayed_cast_saturates_and_reports_amax(fmt):
    fmax = FORMATS[fmt][2]
    x = torch.tensor([[1.0, -3.0, 1e30, -math.inf, math.nan, 2.0**-30]])
    data, amax = fp8_quantize_scaled(x, torch.tensor(fmax / 2), DTYPES[fmt])
    got = data.double().numpy()[0]
    assert got[0] == round_to_fp8(np.array([fmax / 2]), fmt)[0]
    assert got[1] == -fmax and got[2] == fmax and got[3] == -fmax  # saturation, not inf/NaN
    assert math.isnan(got[4])  # NaN stays NaN
    assert got[5] == round_to_fp8(np.array([2.0**-30 * fmax / 2]), fmt)[0]  # 0 for e4m3, a subnormal for e5m2
    assert not math.isfinite(amax.item())  # NaN propagates into the amax: the state then keeps its scale


def test_zero_and_non_finite_amax_give_scale_one():
    for x in (torch.zeros(4, 8), torch.full((4, 8), math.inf), torch.full((4, 8), math.nan)):
        _, scale_inv = fp8_quantize_current(x, torch.float8_e4m3fn)
        assert scale_inv.item() == 1.0
        _, grid = fp8_quantize_blockwise(x, 1, 128, torch.float8_e4m3fn)
        assert grid.eq(1.0).all()
        _, e8m0 = fp8_quantize_mxfp8(x, 32, torch.float8_e4m3fn)
        assert e8m0.float().eq(1.0).all()


@pytest.mark.parametrize("block", [(1, 128), (128, 128)])
@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_blockwise_power_of_two_scales_and_partial_blocks(block, fmt):
    x = wide_range(130, 200, seed=1)  # neither dimension a multiple of 128
    x[:, 128:] = 0.0  # the partial last block column is all zero: scale 1
    data, scale_inv = fp8_quantize_blockwise(x, *block, DTYPES[fmt])
    xd, fmax = x.double().numpy(), FORMATS[fmt][2]
    amax = block_amax(xd, *block)
    assert scale_inv.shape == amax.shape == (math.ceil(130 / block[0]), 2)
    scales = np.vectorize(lambda a: blockwise_scale(a, fmax))(amax)
    np.testing.assert_array_equal(scale_inv.double().numpy(), 1 / scales)
    assert all(s == pow2_floor(s) for s in scales.ravel())
    ref = round_to_fp8(xd * expand(scales, *block, xd.shape), fmt)
    np.testing.assert_array_equal(data.double().numpy(), ref)
    back = fp8_dequantize(data, scale_inv, *block, torch.float64).numpy()
    np.testing.assert_array_equal(back, ref / expand(scales, *block, xd.shape))


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_mxfp8_e8m0_scales_round_up(fmt):
    fmax = FORMATS[fmt][2]
    x = wide_range(5, 200, seed=2)  # 200 = 6 blocks of 32 + a partial block of 8
    x[0, :32] = 0.0
    x[0, 5] = fmax * 4  # amax exactly fmax * 2^2 -> exponent 2, no saturation
    x[1, :32] = 0.0
    x[1, 7] = fmax * 4 * (1 + 2**-20)  # just above -> rounds up to exponent 3
    data, scale = fp8_quantize_mxfp8(x, 32, DTYPES[fmt])
    assert scale.dtype == torch.float8_e8m0fnu and scale.shape == (5, 7)
    xd = x.double().numpy()
    exps = np.vectorize(lambda a: e8m0_exponent(a, fmax))(block_amax(xd, 1, 32))
    assert exps[0, 0] == 2 and exps[1, 0] == 3
    np.testing.assert_array_equal(scale.double().numpy(), 2.0**exps)
    ref = round_to_fp8(xd / expand(2.0**exps, 1, 32, xd.shape), fmt)
    np.testing.assert_array_equal(data.double().numpy(), ref)
    assert np.abs(ref).max() <= fmax and data.double().abs().max().item() == fmax  # rounded up: none clipped
    back = fp8_dequantize(data, scale, 1, 32, torch.float64).numpy()
    np.testing.assert_array_equal(back, ref * expand(2.0**exps, 1, 32, xd.shape))


def test_ops_pass_opcheck():
    # test_schema is left out: it compares outputs with allclose, which torch does not implement for float8
    utils = ("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")
    x = wide_range(40, 70)
    for op, args in ((fp8_quantize_scaled, (x, torch.tensor(3.0), torch.float8_e4m3fn)),
                     (fp8_quantize_current, (x, torch.float8_e5m2)),
                     (fp8_quantize_blockwise, (x, 1, 128, torch.float8_e4m3fn)),
                     (fp8_quantize_mxfp8, (x, 32, torch.float8_e4m3fn))):
        torch.library.opcheck(op, args, test_utils=utils)
    data, scale = fp8_quantize_mxfp8(x, 32, torch.float8_e4m3fn)
    torch.library.opcheck(fp8_dequantize, (data, scale, 1, 32, torch.bfloat16), test_utils=utils)


@pytest.mark.parametrize("algo", ["max", "most_recent"])
def test_delayed_scaling_history_and_margin(algo):
    recipe = DelayedScaling(fp8_format="hybrid", margin=1, amax_history_len=3, amax_compute_algo=algo)
    state = DelayedScalingState(recipe)
    seen = [4.0, 16.0, 2.0, 0.0, math.inf, 1.0]
    expected_scale = 1.0
    history = []
    for amax in seen:
        state.record({"input": torch.tensor(amax), "grad_output": torch.tensor(amax / 8)})
        history = ([amax] + history)[:3]
        pick = max(history) if algo == "max" else history[0]
        if pick > 0 and math.isfinite(pick):
            expected_scale = 448.0 / 2 / pick
        assert state.scale_of("input").item() == pytest.approx(expected_scale, rel=1e-6), (amax, history)
    assert state.scale_of("weight").item() == 1.0  # never recorded
    g_hist = state.amax_history[:, 2].tolist()
    assert g_hist == [1 / 8, math.inf, 0.0]
    # max: inf is still in the window, so the scale from amax 16/8 (two updates ago) is kept
    expected_grad_scale = 57344.0 / 2 / (1 / 8 if algo == "most_recent" else 16.0 / 8)
    assert state.scale_of("grad_output").item() == pytest.approx(expected_grad_scale, rel=1e-6)
    other = DelayedScalingState(recipe)
    other.load_state_dict(state.state_dict())
    assert torch.equal(other.amax_history, state.amax_history) and torch.equal(other.scale, state.scale)
    with pytest.raises(ValueError, match="fp8-amax-history-len"):
        DelayedScalingState(DelayedScaling(amax_history_len=5)).load_state_dict(state.state_dict())
