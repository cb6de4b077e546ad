"""An independent float64 model of FP8 quantization, written from the formats' definitions (not from
mtmegatron.fp8): rounding to the E4M3/E5M2 grid (round-half-to-even, subnormals, saturation), block amaxes
with Python loops, and the scale rules of REFERENCE.md."""

from __future__ import annotations

import math

import numpy as np

# (mantissa bits, minimum normal exponent, max finite value)
FORMATS = {"e4m3": (3, -6, 448.0), "e5m2": (2, -14, 57344.0)}


def round_to_fp8(values: np.ndarray, fmt: str) -> np.ndarray:
    mbits, emin, fmax = FORMATS[fmt]
    out = np.empty_like(values, dtype=np.float64)
    for i, v in enumerate(values.astype(np.float64).ravel()):
        if math.isnan(v):
            out.flat[i] = math.nan
            continue
        a = min(abs(v), fmax)
        e = max(math.frexp(a)[1] - 1, emin) if a > 0 else emin  # a in [2^e, 2^(e+1))
        quantum = 2.0 ** (e - mbits)
        q = round(a / quantum) * quantum  # Python round: half to even
        out.flat[i] = math.copysign(min(q, fmax), v)
    return out.reshape(values.shape)


def block_amax(x: np.ndarray, rows: int, cols: int) -> np.ndarray:
    n_r, n_c = math.ceil(x.shape[0] / rows), math.ceil(x.shape[1] / cols)
    amax = np.zeros((n_r, n_c))
    for i in range(n_r):
        for j in range(n_c):
            amax[i, j] = np.abs(x[i * rows:(i + 1) * rows, j * cols:(j + 1) * cols]).max()
    return amax


def expand(grid: np.ndarray, rows: int, cols: int, shape) -> np.ndarray:
    return np.repeat(np.repeat(grid, rows, 0), cols, 1)[:shape[0], :shape[1]]


def pow2_floor(v: float) -> float:
    """Largest power of two <= v."""
    return 2.0 ** (math.frexp(v)[1] - 1)


def blockwise_scale(amax: float, fmax: float) -> float:
    if not (amax > 0 and math.isfinite(amax)):
        return 1.0
    return pow2_floor(fmax / amax)


def e8m0_exponent(amax: float, fmax: float) -> int:
    """Smallest integer e with amax <= fmax * 2^e (found by stepping, exact in float64)."""
    if not (amax > 0 and math.isfinite(amax)):
        return 0
    e = -130
    while amax > fmax * 2.0 ** e:
        e += 1
    return max(-127, min(127, e))
