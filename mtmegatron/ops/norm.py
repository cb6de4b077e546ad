"""RMSNorm ops: `rms_norm`, `add_rms_norm` (residual add fused in front of the norm) and `rms_norm_backward`
(input and weight gradients), with their Python references, fake kernels and autograd.

Semantics: y = x * rsqrt(mean(x^2) + eps) * weight, statistics in fp32 (fp64 for double input); with a residual
the normalised tensor is the rounded sum x + residual, which is also returned (the next residual).
May assume: torch >= 2.7; device agnostic.
"""
from __future__ import annotations

from typing import Optional

import torch

from ._library import define


def _acc(t: torch.Tensor) -> torch.dtype:
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def _ref_forward(x, weight, eps):
    xf = x.to(_acc(x))
    rstd = torch.rsqrt(xf.pow(2).mean(-1) + eps)
    y = (xf * rstd.unsqueeze(-1) * weight.to(xf.dtype)).to(x.dtype)
    return y, rstd


def rms_norm_reference(input, weight, eps):
    return _ref_forward(input, weight, eps)


def add_rms_norm_reference(input, residual, weight, eps):
    summed = input + residual
    y, rstd = _ref_forward(summed, weight, eps)
    return y, summed, rstd


def rms_norm_backward_reference(grad_out, input, weight, rstd, grad_residual):
    acc = _acc(input)
    xh = input.to(acc) * rstd.unsqueeze(-1)
    g = grad_out.to(acc)
    gw_in = g * weight.to(acc)
    grad_w = (g * xh).reshape(-1, input.shape[-1]).sum(0).to(weight.dtype)
    c = (gw_in * xh).mean(-1, keepdim=True)
    grad_x = rstd.unsqueeze(-1) * (gw_in - xh * c)
    if grad_residual is not None:
        grad_x = grad_x + grad_residual.to(acc)
    return grad_x.to(input.dtype), grad_w


rms_norm_op = define("rms_norm(Tensor input, Tensor weight, float eps) -> (Tensor, Tensor)", rms_norm_reference)
add_rms_norm_op = define(
    "add_rms_norm(Tensor input, Tensor residual, Tensor weight, float eps) -> (Tensor, Tensor, Tensor)",
    add_rms_norm_reference,
)
rms_norm_backward_op = define(
    "rms_norm_backward(Tensor grad_out, Tensor input, Tensor weight, Tensor rstd, Tensor? grad_residual)"
    " -> (Tensor, Tensor)",
    rms_norm_backward_reference,
)


def _stat_shape(x):
    return x.new_empty(x.shape[:-1], dtype=_acc(x))


@torch.library.register_fake("mtmegatron::rms_norm")
def _(input, weight, eps):
    return torch.empty_like(input), _stat_shape(input)


@torch.library.register_fake("mtmegatron::add_rms_norm")
def _(input, residual, weight, eps):
    return torch.empty_like(input), torch.empty_like(input), _stat_shape(input)


@torch.library.register_fake("mtmegatron::rms_norm_backward")
def _(grad_out, input, weight, rstd, grad_residual):
    return torch.empty_like(input), torch.empty_like(weight)


def _setup(ctx, inputs, output):
    input, weight = inputs[0], inputs[1]
    ctx.save_for_backward(input, weight, output[1])


def _backward(ctx, grad_y, grad_rstd):
    input, weight, rstd = ctx.saved_tensors
    grad_x, grad_w = rms_norm_backward_op(grad_y, input, weight, rstd, None)
    return grad_x, grad_w, None


def _setup_add(ctx, inputs, output):
    ctx.save_for_backward(output[1], inputs[2], output[2])


def _backward_add(ctx, grad_y, grad_sum, grad_rstd):
    summed, weight, rstd = ctx.saved_tensors
    grad_x, grad_w = rms_norm_backward_op(grad_y, summed, weight, rstd, grad_sum)
    return grad_x, grad_x, grad_w, None


torch.library.register_autograd("mtmegatron::rms_norm", _backward, setup_context=_setup)
torch.library.register_autograd("mtmegatron::add_rms_norm", _backward_add, setup_context=_setup_add)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-5, residual: Optional[torch.Tensor] = None):
    """RMSNorm over the last dim. Without `residual` returns y; with it returns (y, x + residual)."""
    if residual is None:
        return rms_norm_op(x, weight, eps)[0]
    y, summed, _ = add_rms_norm_op(x, residual, weight, eps)
    return y, summed
