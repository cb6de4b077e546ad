"""FP8 recipes and formats as dataclasses, named as megatron-core / TransformerEngine name them.

Formats: ``e4m3`` (E4M3 everywhere) and ``hybrid`` (E4M3 forward, E5M2 for gradients). Recipes: ``delayed``
(scale from an amax history), ``tensorwise`` (current per-tensor scaling), ``blockwise`` (DeepSeek-V3: 1x128
tiles for activations and gradients, 128x128 blocks for weights, power-of-2 scales) and ``mxfp8`` (1x32
blocks, E8M0 scales rounded up). ``recipe_of`` builds one from the FP8 flags (the ``Fp8`` section, fp8/section.py).
May assume: torch >= 2.7 (float8 dtypes; float8_e8m0fnu is only needed by mxfp8).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

FP8_MAX = {torch.float8_e4m3fn: 448.0, torch.float8_e5m2: 57344.0}
FORMATS = ("e4m3", "hybrid")
RECIPES = ("delayed", "tensorwise", "blockwise", "mxfp8")


@dataclass(frozen=True)
class Recipe:
    """What every recipe shares: the format, which decides the dtype of forward tensors and of gradients."""

    fp8_format: str = "hybrid"
    name: ClassVar[str] = ""

    @property
    def fwd_dtype(self) -> torch.dtype:
        return torch.float8_e4m3fn

    @property
    def bwd_dtype(self) -> torch.dtype:
        return torch.float8_e5m2 if self.fp8_format == "hybrid" else torch.float8_e4m3fn


@dataclass(frozen=True)
class DelayedScaling(Recipe):
    """scale = fp8_max * 2^-margin / amax, amax taken from the last ``amax_history_len`` amaxes."""

    margin: int = 0
    amax_history_len: int = 1
    amax_compute_algo: str = "most_recent"
    name: ClassVar[str] = "delayed"


@dataclass(frozen=True)
class TensorwiseScaling(Recipe):
    """Current scaling: scale = fp8_max / amax of the tensor being cast (TE's Float8CurrentScaling)."""

    name: ClassVar[str] = "tensorwise"


@dataclass(frozen=True)
class BlockwiseScaling(Recipe):
    """DeepSeek-V3 block scaling (TE's Float8BlockScaling): power-of-2 fp32 scale per block."""

    activation_block: tuple[int, int] = (1, 128)
    weight_block: tuple[int, int] = (128, 128)
    name: ClassVar[str] = "blockwise"


@dataclass(frozen=True)
class MXFP8Scaling(Recipe):
    """OCP MX: one E8M0 scale per 32 consecutive values along the contraction dimension."""

    block_size: int = 32
    name: ClassVar[str] = "mxfp8"


_BY_NAME = {cls.name: cls for cls in (DelayedScaling, TensorwiseScaling, BlockwiseScaling, MXFP8Scaling)}


def recipe_of(fp8) -> Recipe | None:
    """The recipe ``fp8`` (an ``Fp8`` section) asks for, or None when ``--fp8-format`` is not given."""
    if not fp8.fp8:
        return None
    cls = _BY_NAME[fp8.fp8_recipe]
    if cls is DelayedScaling:
        return cls(fp8_format=fp8.fp8, margin=fp8.fp8_margin, amax_history_len=fp8.fp8_amax_history_len,
                   amax_compute_algo=fp8.fp8_amax_compute_algo)
    return cls(fp8_format=fp8.fp8)
