"""Megatron's fused attention softmaxes as ops:
`scaled_masked_softmax(input [b, np, sq, sk], mask [b|1, 1, sq, sk] bool (True = masked) or None, scale)`:
softmax(masked_fill(input * scale, mask, -10000)) like FusedScaleMaskSoftmax's unfused path;
`scaled_upper_triang_masked_softmax(input [b*np, sq, sk], scale)`: causal (column > row gets probability 0).
Both compute in fp32 (fp64 for double) and return the input dtype. Backward: scale * y * (g - sum(g*y)), zero
at masked positions.
May assume: torch >= 2.7; device agnostic.
"""
from __future__ import annotations

import torch

from ._library import define


def _acc(t):
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def _causal_mask(sq, sk, device):
    return torch.ones(sq, sk, dtype=torch.bool, device=device).triu(1)


def scaled_masked_softmax_reference(input, mask, scale):
    x = input.to(_acc(input)) * scale
    if mask is not None:
        x = x.masked_fill(mask.bool(), -10000.0)
    return torch.softmax(x, dim=-1).to(input.dtype)


def _softmax_grad(grad_out, out, mask, scale):
    y = out.to(_acc(out))
    g = grad_out.to(y.dtype)
    gx = scale * y * (g - (g * y).sum(-1, keepdim=True))
    if mask is not None:
        gx = gx.masked_fill(mask, 0.0)
    return gx.to(out.dtype)


def scaled_masked_softmax_backward_reference(grad_out, out, mask, scale):
    return _softmax_grad(grad_out, out, None if mask is None else mask.bool(), scale)


def scaled_upper_triang_masked_softmax_reference(input, scale):
    sq, sk = input.shape[-2], input.shape[-1]
    x = (input.to(_acc(input)) * scale).masked_fill(_causal_mask(sq, sk, input.device), float("-inf"))
    return torch.softmax(x, dim=-1).to(input.dtype)


def scaled_upper_triang_masked_softmax_backward_reference(grad_out, out, scale):
    sq, sk = out.shape[-2], out.shape[-1]
    return _softmax_grad(grad_out, out, _causal_mask(sq, sk, out.device), scale)


scaled_masked_softmax_op = define(
    "scaled_masked_softmax(Tensor input, Tensor? mask, float scale) -> Tensor", scaled_masked_softmax_reference
)
scaled_masked_softmax_backward_op = define(
    "scaled_masked_softmax_backward(Tensor grad_out, Tensor out, Tensor? mask, float scale) -> Tensor",
    scaled_masked_softmax_backward_reference,
)
scaled_upper_triang_masked_softmax_op = define(
    "scaled_upper_triang_masked_softmax(Tensor input, float scale) -> Tensor",
    scaled_upper_triang_masked_softmax_reference,
)
scaled_upper_triang_masked_softmax_backward_op = define(
    "scaled_upper_triang_masked_softmax_backward(Tensor grad_out, Tensor out, float scale) -> Tensor",
    scaled_upper_triang_masked_softmax_backward_reference,
)

for _name in ("scaled_masked_softmax", "scaled_upper_triang_masked_softmax"):

    @torch.library.register_fake(f"mtmegatron::{_name}")
    def _(input, *args):
        return torch.empty_like(input)

    @torch.library.register_fake(f"mtmegatron::{_name}_backward")
    def _(grad_out, out, *args):
        return torch.empty_like(out)


def _setup_masked(ctx, inputs, output):
    ctx.save_for_backward(output, inputs[1])
    ctx.scale = inputs[2]


def _backward_masked(ctx, grad):
    out, mask = ctx.saved_tensors
    return scaled_masked_softmax_backward_op(grad, out, mask, ctx.scale), None, None


def _setup_causal(ctx, inputs, output):
    ctx.save_for_backward(output)
    ctx.scale = inputs[1]


def _backward_causal(ctx, grad):
    (out,) = ctx.saved_tensors
    return scaled_upper_triang_masked_softmax_backward_op(grad, out, ctx.scale), None


torch.library.register_autograd("mtmegatron::scaled_masked_softmax", _backward_masked, setup_context=_setup_masked)
torch.library.register_autograd(
    "mtmegatron::scaled_upper_triang_masked_softmax", _backward_causal, setup_context=_setup_causal
)


def scaled_masked_softmax(input, mask, scale: float = 1.0):
    return scaled_masked_softmax_op(input, mask, float(scale))


def scaled_upper_triang_masked_softmax(input, scale: float = 1.0):
    return scaled_upper_triang_masked_softmax_op(input, float(scale))
