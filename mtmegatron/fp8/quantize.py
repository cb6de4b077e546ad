"""FP8 quantize/dequantize for every recipe as ``torch.library`` ops in namespace ``mtmegatron``.

- ``fp8_quantize_scaled(x, scale, dtype) -> (data, amax)``: cast with a given scale (delayed scaling), returning
  the amax of ``x`` for the history;
- ``fp8_quantize_current(x, dtype) -> (data, scale_inv)``: per-tensor current scaling (tensorwise);
- ``fp8_quantize_blockwise(x, block_rows, block_cols, dtype) -> (data, scale_inv)``: power-of-2 fp32 scale per
  ``block_rows x block_cols`` block of a 2-D ``x`` (partial blocks at the edges get their own scale);
- ``fp8_quantize_mxfp8(x, block_size, dtype) -> (data, scale)``: E8M0 scale (``float8_e8m0fnu``) per 1 x
  ``block_size`` block of a 2-D ``x``, rounded up so nothing saturates;
- ``fp8_dequantize(data, scale_inv, block_rows, block_cols, dtype)``: the inverse of all four (``scale_inv``
  a single value, or one per block; E8M0 scales are accepted as they are).
Every cast saturates at the format's maximum (448 for E4M3, 57344 for E5M2); NaN stays NaN.
The implementations are torch-composed and registered for CompositeExplicitAutograd, so the same code serves
the CPU and CUDA (and MUSA) dispatch keys; there is no hand-written device kernel (see docs/fp8.md).
May assume: torch >= 2.7; device agnostic.
"""

from __future__ import annotations

import torch

from mtmegatron.ops._library import define

from .recipes import FP8_MAX
from .scaling import current_scale, e8m0_exponent, pow2_scale


def saturating_cast(x: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    fp8_max = FP8_MAX[dtype]
    return (x.float() * scale).clamp(-fp8_max, fp8_max).to(dtype)


def block_amax(x: torch.Tensor, block_rows: int, block_cols: int) -> torch.Tensor:
    """amax of each block of a 2-D tensor, shape [ceil(R / block_rows), ceil(C / block_cols)]."""
    rows, cols = x.shape
    num_r, num_c = -(-rows // block_rows), -(-cols // block_cols)
    padded = torch.nn.functional.pad(x.float().abs(), (0, num_c * block_cols - cols, 0, num_r * block_rows - rows))
    return padded.view(num_r, block_rows, num_c, block_cols).amax(dim=(1, 3))


def expand_blocks(grid: torch.Tensor, block_rows: int, block_cols: int, rows: int, cols: int) -> torch.Tensor:
    """A per-block grid repeated over each block's elements, cropped to [rows, cols]."""
    return grid.repeat_interleave(block_rows, 0).repeat_interleave(block_cols, 1)[:rows, :cols]


def _quantize_scaled(x, scale, dtype):
    return saturating_cast(x, scale.float(), dtype), x.detach().abs().amax().float()


def _quantize_current(x, dtype):
    scale = current_scale(x.detach().abs().amax(), FP8_MAX[dtype])
    return saturating_cast(x, scale, dtype), scale.reciprocal()


def _quantize_blockwise(x, block_rows, block_cols, dtype):
    scale = pow2_scale(block_amax(x, block_rows, block_cols), FP8_MAX[dtype])
    data = saturating_cast(x, expand_blocks(scale, block_rows, block_cols, *x.shape), dtype)
    return data, scale.reciprocal()  # exact: powers of two


def _quantize_mxfp8(x, block_size, dtype):
    exponent = e8m0_exponent(block_amax(x, 1, block_size), FP8_MAX[dtype])
    scale_inv = torch.ldexp(torch.ones_like(exponent, dtype=torch.float32), exponent)
    data = saturating_cast(x, expand_blocks(scale_inv.reciprocal(), 1, block_size, *x.shape), dtype)
    return data, scale_inv.to(torch.float8_e8m0fnu)


def _dequantize(data, scale_inv, block_rows, block_cols, dtype):
    scale_inv = scale_inv.float()
    if scale_inv.numel() == 1:
        scale_inv = scale_inv.reshape(())
    else:
        scale_inv = expand_blocks(scale_inv, block_rows, block_cols, *data.shape)
    return (data.float() * scale_inv).to(dtype)


fp8_quantize_scaled = define("fp8_quantize_scaled(Tensor x, Tensor scale, ScalarType dtype) -> (Tensor, Tensor)",
                             _quantize_scaled)
fp8_quantize_current = define("fp8_quantize_current(Tensor x, ScalarType dtype) -> (Tensor, Tensor)",
                              _quantize_current)
fp8_quantize_blockwise = define(
    "fp8_quantize_blockwise(Tensor x, int block_rows, int block_cols, ScalarType dtype) -> (Tensor, Tensor)",
    _quantize_blockwise)
fp8_quantize_mxfp8 = define("fp8_quantize_mxfp8(Tensor x, int block_size, ScalarType dtype) -> (Tensor, Tensor)",
                            _quantize_mxfp8)
fp8_dequantize = define(
    "fp8_dequantize(Tensor data, Tensor scale_inv, int block_rows, int block_cols, ScalarType dtype) -> Tensor",
    _dequantize)


def _grid(rows, cols, block_rows, block_cols, like, dtype=torch.float32):
    return like.new_empty((-(-rows // block_rows), -(-cols // block_cols)), dtype=dtype)


@torch.library.register_fake("mtmegatron::fp8_quantize_scaled")
def _(x, scale, dtype):
    return torch.empty_like(x, dtype=dtype), x.new_empty((), dtype=torch.float32)


@torch.library.register_fake("mtmegatron::fp8_quantize_current")
def _(x, dtype):
    return torch.empty_like(x, dtype=dtype), x.new_empty((), dtype=torch.float32)


@torch.library.register_fake("mtmegatron::fp8_quantize_blockwise")
def _(x, block_rows, block_cols, dtype):
    return torch.empty_like(x, dtype=dtype), _grid(*x.shape, block_rows, block_cols, x)


@torch.library.register_fake("mtmegatron::fp8_quantize_mxfp8")
def _(x, block_size, dtype):
    return torch.empty_like(x, dtype=dtype), _grid(*x.shape, 1, block_size, x, torch.float8_e8m0fnu)


@torch.library.register_fake("mtmegatron::fp8_dequantize")
def _(data, scale_inv, block_rows, block_cols, dtype):
    return torch.empty_like(data, dtype=dtype)
