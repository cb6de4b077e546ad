"""Sliding-window attention and attention sinks (megatron-core's ``window_size`` and ``softmax_type``) for SDPA.

Semantics (megatron-core 0.16.1 / TransformerEngine):
- window ``(left, right)``, ``-1`` = unbounded on that side: query at position ``i`` may attend keys ``j`` with
  ``i - left <= j <= i + right``; on a causal layer also ``j <= i`` (TE's convention: causal and window together;
  ``(w, 0)`` is the usual causal window of ``w + 1`` keys). Positions are global: a query row of a CP chunk or a
  packed (THD) sequence is placed where it sits in its sequence, and a query block shorter than its keys is
  aligned bottom-right (megatron's ``get_sliding_window_causal_mask``). ``window_for_layer`` applies megatron's
  ``is_layer_window_attention`` (``window_attn_skip_freq`` int or list pattern, layers 1-indexed).
- sink: one logit per query head (``softmax_offset``, ``[heads of this TP partition]``) added to the softmax
  denominator, with no value: ``p_ij = exp(s_ij) / (exp(sink_h) + sum_j exp(s_ij))`` (megatron's ``SoftmaxOne``;
  ``off-by-one`` is sink 0). Equivalently ``out = out_plain * sigmoid(lse - sink)``.
``sdpa_window_sink`` runs that through ``scaled_dot_product_attention`` with a boolean band mask and the sink as
one extra key: every query gets an extra channel ``sink_h / scale`` (per query head, so GQA's shared K/V heads
stay shared), the extra key has ``1`` in that channel and zeros elsewhere, its value is zero and it is visible to
every query; so its score is exactly ``sink_h`` and autograd gives the sink's gradient. q/k (and v when it has the
same head dim) get 8 more channels (zeros besides the sink channel) so the fused kernels keep a head dim that is a
multiple of 8. The ring (ring.py) merges the sink as one more log-sum-exp block instead (``sink_lse``).
May assume: torch >= 2.5; tensors ``[b, heads, s, d]``; no process groups, no device API calls.
"""

from __future__ import annotations

from typing import Optional

import torch
from megatron.core.transformer.utils import is_layer_window_attention

from mtmegatron.attention.sdpa import sdpa

SINK_CHANNELS = 8

Window = Optional[tuple[int, int]]


def window_for_layer(config, layer_number: int) -> Window:
    """``config.window_size`` as an ``(left, right)`` tuple where this layer is a window layer, else ``None``."""
    if not is_layer_window_attention(config.window_size, config.window_attn_skip_freq, layer_number):
        return None
    left, right = config.window_size
    return int(left), int(right)


def allowed_mask(q_pos: torch.Tensor, k_pos: torch.Tensor, window: Window, causal: bool) -> torch.Tensor:
    """``[sq, sk]`` boolean, True where the query at ``q_pos[i]`` may attend the key at ``k_pos[j]``."""
    q, k = q_pos.view(-1, 1), k_pos.view(1, -1)
    allowed = torch.ones(q.shape[0], k.shape[1], dtype=torch.bool, device=q_pos.device)
    if causal:
        allowed &= k <= q
    if window is not None:
        left, right = window
        if left >= 0:
            allowed &= k >= q - left
        if right >= 0:
            allowed &= k <= q + right
    return allowed


def block_allowed(q_start: int, sq: int, k_start: int, sk: int, window: Window, causal: bool,
                  device) -> torch.Tensor:
    """``allowed_mask`` for queries at ``q_start ...`` and keys at ``k_start ...`` (consecutive positions)."""
    return allowed_mask(torch.arange(q_start, q_start + sq, device=device),
                        torch.arange(k_start, k_start + sk, device=device), window, causal)


def _with_sink_key(q, k, v, allowed, sink, scale):
    """q/k/v/mask with the sink as one extra key (see the module docstring)."""
    b, hq, sq, dk = q.shape
    hk, sk, dv = k.shape[1], k.shape[2], v.shape[-1]
    pad = SINK_CHANNELS
    column = (sink.to(q.dtype) / scale).view(1, hq, 1, 1).expand(b, hq, sq, 1)
    q = torch.cat([q, column, q.new_zeros(b, hq, sq, pad - 1)], dim=-1)
    sink_key = k.new_zeros(b, hk, 1, dk + pad)
    sink_key[..., dk] = 1.0
    k = torch.cat([torch.cat([k, k.new_zeros(b, hk, sk, pad)], dim=-1), sink_key], dim=2)
    if dv == dk:  # one head dim for the fused kernels; the zero channels are cropped from the output
        v = torch.cat([v, v.new_zeros(b, hk, sk, pad)], dim=-1)
    v = torch.cat([v, v.new_zeros(b, hk, 1, v.shape[-1])], dim=2)
    visible = torch.ones(*allowed.shape[:-1], 1, dtype=torch.bool, device=allowed.device)
    return q, k, v, torch.cat([allowed, visible], dim=-1)


def sdpa_window_sink(q, k, v, allowed: torch.Tensor, sink: Optional[torch.Tensor], scale: float,
                     dropout_p: float = 0.0) -> torch.Tensor:
    """Attention ``[b, hq, sq, dv]`` under the boolean ``allowed`` mask (broadcastable to ``[b, 1|hq, sq, sk]``,
    True = may attend), with the per-head ``sink`` in the denominator when given."""
    dv = v.shape[-1]
    if sink is not None:
        q, k, v, allowed = _with_sink_key(q, k, v, allowed, sink, scale)
    return sdpa(q, k, v, attn_mask=allowed, scale=scale, dropout_p=dropout_p)[..., :dv]


def sink_lse(sink: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """The sink as a log-sum-exp block ``[b, hq, s]`` shaped as ``like`` (an LSE accumulator)."""
    return sink.to(like.dtype).view(1, -1, 1).expand_as(like)
