"""SwiGLU on megatron's fused fc1 output (last dim = cat([gate, up])): y = silu(gate) * up, plus its backward.
May assume: torch >= 2.7; device agnostic.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ._library import define


def _acc(t):
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def swiglu_reference(input):
    gate, up = input.to(_acc(input)).chunk(2, dim=-1)
    return (F.silu(gate) * up).to(input.dtype)


def swiglu_backward_reference(grad_out, input):
    gate, up = input.to(_acc(input)).chunk(2, dim=-1)
    g = grad_out.to(gate.dtype)
    s = torch.sigmoid(gate)
    grad_gate = g * up * s * (1 + gate * (1 - s))
    grad_up = g * gate * s
    return torch.cat([grad_gate, grad_up], dim=-1).to(input.dtype)


swiglu_op = define("swiglu(Tensor input) -> Tensor", swiglu_reference)
swiglu_backward_op = define("swiglu_backward(Tensor grad_out, Tensor input) -> Tensor", swiglu_backward_reference)


@torch.library.register_fake("mtmegatron::swiglu")
def _(input):
    torch._check(input.shape[-1] % 2 == 0, lambda: "swiglu: last dim must be even")
    return input.new_empty((*input.shape[:-1], input.shape[-1] // 2))


@torch.library.register_fake("mtmegatron::swiglu_backward")
def _(grad_out, input):
    return torch.empty_like(input)


def _setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0])


def _backward(ctx, grad_y):
    (input,) = ctx.saved_tensors
    return swiglu_backward_op(grad_y, input)


torch.library.register_autograd("mtmegatron::swiglu", _backward, setup_context=_setup)


def swiglu(x: torch.Tensor) -> torch.Tensor:
    """silu(x[..., :n]) * x[..., n:] for x of last dim 2n (megatron's gated linear unit with F.silu)."""
    return swiglu_op(x)
