"""The FP8 scale rules (REFERENCE.md, FP8 section), shared by the quantize ops and the delayed-scaling state.

A *scale* multiplies a high-precision value into the FP8 range (q = saturate(x * scale)); dequantization
multiplies by ``scale_inv = 1 / scale``. All rules work elementwise on fp32 amax tensors, so they serve a
whole tensor, a grid of blocks or an amax history alike.
May assume: torch >= 2.7; device agnostic.
"""

from __future__ import annotations

import torch

FP32_MAX = torch.finfo(torch.float32).max


def _usable(amax: torch.Tensor) -> torch.Tensor:
    return (amax > 0) & torch.isfinite(amax)


def current_scale(amax: torch.Tensor, fp8_max: float) -> torch.Tensor:
    """scale = fp8_max / amax; 1 where amax is 0 or not finite; capped at the fp32 maximum (tiny amax)."""
    amax = amax.float()
    scale = (fp8_max / torch.where(_usable(amax), amax, 1.0)).clamp(max=FP32_MAX)
    return torch.where(_usable(amax), scale, 1.0)


def delayed_scale(amax: torch.Tensor, fp8_max: float | torch.Tensor, margin: int,
                  old_scale: torch.Tensor) -> torch.Tensor:
    """scale = fp8_max * 2^-margin / amax; the old scale is kept where amax is 0 or not finite."""
    amax = amax.float()
    scale = (fp8_max / torch.where(_usable(amax), amax, 1.0) / 2.0**margin).clamp(max=FP32_MAX)
    return torch.where(_usable(amax), scale, old_scale.float())


def pow2_scale(amax: torch.Tensor, fp8_max: float) -> torch.Tensor:
    """The current scale rounded down to a power of two (so x * scale never exceeds fp8_max); exact via frexp."""
    _, exponent = torch.frexp(current_scale(amax, fp8_max))  # scale = m * 2^e, m in [0.5, 1)
    return torch.ldexp(torch.ones_like(amax, dtype=torch.float32), exponent - 1)


def e8m0_exponent(amax: torch.Tensor, fp8_max: float) -> torch.Tensor:
    """Smallest integer e with amax <= fp8_max * 2^e, i.e. ceil(log2(amax / fp8_max)), in [-127, 127];
    0 (scale 1) where amax is 0 or not finite. Exact: no log2 rounding."""
    amax = amax.float()
    _, e_amax = torch.frexp(torch.where(_usable(amax), amax, 1.0))  # amax in [2^(e-1), 2^e)
    _, e_max = torch.frexp(torch.tensor(fp8_max, dtype=torch.float32))
    base = e_amax - e_max.to(amax.device)
    exponent = base + (amax > torch.ldexp(torch.full_like(amax, fp8_max), base)).to(base.dtype)
    return torch.where(_usable(amax), exponent, 0).clamp(-127, 127)
