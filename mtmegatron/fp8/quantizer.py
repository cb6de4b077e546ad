"""Turns a recipe into casts: ``Quantizer(recipe, state)(x, role)`` quantizes a 2-D tensor along its last
(contraction) dimension for one GEMM operand role (``input``, ``weight`` or ``grad_output``).

Forward tensors use the recipe's forward dtype (E4M3), gradients its backward dtype (E5M2 under ``hybrid``).
Blockwise gives weights 128x128 blocks and activations/gradients 1x128 tiles; mxfp8 gives every operand 1x32
blocks. Delayed scaling casts with the state's scale and reports the amax it saw (the caller records it).
May assume: 2-D inputs.
"""

from __future__ import annotations

import torch

from .executors import QTensor
from .quantize import fp8_quantize_blockwise, fp8_quantize_current, fp8_quantize_mxfp8, fp8_quantize_scaled
from .recipes import BlockwiseScaling, DelayedScaling, MXFP8Scaling, Recipe


class Quantizer:
    def __init__(self, recipe: Recipe, state=None):
        self.recipe = recipe
        self.state = state

    @property
    def tensor_scaled(self) -> bool:
        """One scale per tensor: a quantized tensor may simply be transposed for the other GEMM operand."""
        return not isinstance(self.recipe, (BlockwiseScaling, MXFP8Scaling))

    def dtype(self, role: str) -> torch.dtype:
        return self.recipe.bwd_dtype if role == "grad_output" else self.recipe.fwd_dtype

    def __call__(self, x: torch.Tensor, role: str) -> tuple[QTensor, torch.Tensor | None]:
        """(quantized x, amax seen: only for delayed scaling, else None)."""
        dtype, recipe = self.dtype(role), self.recipe
        if isinstance(recipe, DelayedScaling):
            scale = self.state.scale_of(role)
            data, amax = fp8_quantize_scaled(x, scale, dtype)
            return QTensor(data, scale.reciprocal()), amax
        if isinstance(recipe, BlockwiseScaling):
            block = recipe.weight_block if role == "weight" else recipe.activation_block
            data, scale_inv = fp8_quantize_blockwise(x, block[0], block[1], dtype)
            return QTensor(data, scale_inv, tuple(block)), None
        if isinstance(recipe, MXFP8Scaling):
            data, scale = fp8_quantize_mxfp8(x, recipe.block_size, dtype)
            return QTensor(data, scale, (1, recipe.block_size)), None
        data, scale_inv = fp8_quantize_current(x, dtype)
        return QTensor(data, scale_inv), None
