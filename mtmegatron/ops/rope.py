"""Rotary position embedding on megatron's [s, b, h, d] layout: `rope` and `rope_backward`.

freqs is [s, 1 or b, 1, rot] (angles, as megatron's RotaryEmbedding returns them); dims past rot pass through
(partial rotary, e.g. MLA's qk_pos_emb_head_dim). Layouts: 0 rotate-half, 1 interleaved, 2 MLA (the rotary
part is de-interleaved [x0, x2, ..., x1, x3, ...] then rotated as rotate-half, as megatron does for MLA).
cos/sin are multiplied by mscale. Computed in fp32 (fp64 for double input).
May assume: torch >= 2.7; device agnostic.
"""
from __future__ import annotations

import torch

from ._library import define

ROTATE_HALF, INTERLEAVED, MLA = 0, 1, 2


def _acc(t):
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def _pair_index(layout: int, rot: int, device):
    half = rot // 2
    p = torch.arange(half, device=device)
    if layout == ROTATE_HALF:
        return p, p + half, p, p + half
    if layout == INTERLEAVED:
        return 2 * p, 2 * p + 1, 2 * p, 2 * p + 1
    return 2 * p, 2 * p + 1, p, p + half


def _rotate(x, freqs, layout, mscale, backward):
    acc = _acc(x)
    rot = freqs.shape[-1]
    f = freqs.to(acc)
    cos, sin = torch.cos(f) * mscale, torch.sin(f) * mscale
    xr = x[..., :rot].to(acc)
    ia, ib, oa, ob = _pair_index(layout, rot, x.device)
    out = torch.empty_like(xr)
    if not backward:
        xa, xb = xr[..., ia], xr[..., ib]
        out[..., oa] = xa * cos[..., oa] - xb * sin[..., oa]
        out[..., ob] = xb * cos[..., ob] + xa * sin[..., ob]
    else:
        ga, gb = xr[..., oa], xr[..., ob]
        out[..., ia] = ga * cos[..., oa] + gb * sin[..., ob]
        out[..., ib] = gb * cos[..., ob] - ga * sin[..., oa]
    return torch.cat([out.to(x.dtype), x[..., rot:]], dim=-1)


def rope_reference(input, freqs, layout, mscale):
    return _rotate(input, freqs, layout, mscale, backward=False)


def rope_backward_reference(grad_out, freqs, layout, mscale):
    return _rotate(grad_out, freqs, layout, mscale, backward=True)


rope_op = define("rope(Tensor input, Tensor freqs, int layout, float mscale) -> Tensor", rope_reference)
rope_backward_op = define(
    "rope_backward(Tensor grad_out, Tensor freqs, int layout, float mscale) -> Tensor", rope_backward_reference
)


@torch.library.register_fake("mtmegatron::rope")
def _(input, freqs, layout, mscale):
    return torch.empty_like(input)


@torch.library.register_fake("mtmegatron::rope_backward")
def _(grad_out, freqs, layout, mscale):
    return torch.empty_like(grad_out)


def _setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[1])
    ctx.layout, ctx.mscale = inputs[2], inputs[3]


def _backward(ctx, grad):
    (freqs,) = ctx.saved_tensors
    return rope_backward_op(grad, freqs, ctx.layout, ctx.mscale), None, None, None


torch.library.register_autograd("mtmegatron::rope", _backward, setup_context=_setup)


def fused_apply_rotary_pos_emb(
    t: torch.Tensor,
    freqs: torch.Tensor,
    interleaved: bool = False,
    multi_latent_attention: bool = False,
    mscale: float = 1.0,
) -> torch.Tensor:
    """Drop-in for megatron's `_apply_rotary_pos_emb_bshd` / TE's `fused_apply_rotary_pos_emb` on [s, b, h, d]."""
    if multi_latent_attention and interleaved:
        raise ValueError("rotary_interleaved does not work with multi_latent_attention")
    layout = MLA if multi_latent_attention else (INTERLEAVED if interleaved else ROTATE_HALF)
    return rope_op(t, freqs, layout, float(mscale))
