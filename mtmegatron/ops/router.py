"""DeepSeek-V3 router top-k as one op: `moe_router_topk(logits [T, E], expert_bias [E] or None, topk, num_groups,
group_topk, scaling_factor) -> (routing_probs [T, E], routing_map [T, E] bool)` and its backward.

Semantics are megatron's `topk_routing_with_score_function(score_function="sigmoid")`: scores =
sigmoid(logits) rounded to the logits dtype; experts chosen on scores + expert_bias; group-limited when
group_topk > 0 (group score = sum of the top topk/group_topk biased scores in the group; best group_topk groups);
weights are the unbiased scores of the chosen experts, divided by their sum (+1e-20) when topk > 1, times
scaling_factor. The bias gets no gradient. Ties go to the lower expert index in the native kernels.
May assume: torch >= 2.7; device agnostic; megatron-core only for the non-sigmoid fallback.
"""
from __future__ import annotations

import torch

from ._library import define


def _acc(t):
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def _scores(logits):
    sg = torch.sigmoid(logits.to(_acc(logits)))
    return sg, sg.to(logits.dtype).to(sg.dtype)


def moe_router_topk_reference(logits, expert_bias, topk, num_groups, group_topk, scaling_factor):
    num_tokens, num_experts = logits.shape
    _, scores = _scores(logits)
    routing = scores + expert_bias.to(scores.dtype) if expert_bias is not None else scores
    if group_topk > 0 and num_groups > 1:
        grouped = routing.view(num_tokens, num_groups, -1)
        group_scores = grouped.topk(topk // group_topk, dim=-1).values.sum(-1)
        group_idx = group_scores.topk(group_topk, dim=-1).indices
        group_mask = torch.zeros_like(group_scores, dtype=torch.bool).scatter(1, group_idx, True)
        keep = group_mask.unsqueeze(-1).expand_as(grouped).reshape(num_tokens, -1)
        routing = routing.masked_fill(~keep, float("-inf"))
    top = routing.topk(topk, dim=-1).indices
    chosen = scores.gather(1, top)
    if topk > 1:
        chosen = chosen / (chosen.sum(-1, keepdim=True) + 1e-20)
    chosen = chosen * scaling_factor
    probs = torch.zeros_like(scores).scatter(1, top, chosen).to(logits.dtype)
    routing_map = torch.zeros_like(scores, dtype=torch.bool).scatter(1, top, True)
    return probs, routing_map


def moe_router_topk_backward_reference(grad_probs, logits, routing_map, topk, scaling_factor):
    sg, s = _scores(logits)
    m = routing_map.bool()
    g = grad_probs.to(sg.dtype)
    if topk > 1:
        z = (s * m).sum(-1, keepdim=True) + 1e-20
        gs = (g * s * m).sum(-1, keepdim=True)
        ds = scaling_factor * (g / z - gs / (z * z))
    else:
        ds = scaling_factor * g
    return torch.where(m, ds * sg * (1 - sg), torch.zeros_like(sg)).to(logits.dtype)


moe_router_topk_op = define(
    "moe_router_topk(Tensor logits, Tensor? expert_bias, int topk, int num_groups, int group_topk,"
    " float scaling_factor) -> (Tensor, Tensor)",
    moe_router_topk_reference,
)
moe_router_topk_backward_op = define(
    "moe_router_topk_backward(Tensor grad_probs, Tensor logits, Tensor routing_map, int topk,"
    " float scaling_factor) -> Tensor",
    moe_router_topk_backward_reference,
)


@torch.library.register_fake("mtmegatron::moe_router_topk")
def _(logits, expert_bias, topk, num_groups, group_topk, scaling_factor):
    return torch.empty_like(logits), torch.empty_like(logits, dtype=torch.bool)


@torch.library.register_fake("mtmegatron::moe_router_topk_backward")
def _(grad_probs, logits, routing_map, topk, scaling_factor):
    return torch.empty_like(logits)


def _setup(ctx, inputs, output):
    logits, _, topk, _, _, scaling_factor = inputs
    ctx.save_for_backward(logits, output[1])
    ctx.topk, ctx.scaling_factor = topk, scaling_factor
    ctx.mark_non_differentiable(output[1])


def _backward(ctx, grad_probs, grad_map):
    logits, routing_map = ctx.saved_tensors
    grad = moe_router_topk_backward_op(grad_probs, logits, routing_map, ctx.topk, ctx.scaling_factor)
    return grad, None, None, None, None, None


torch.library.register_autograd("mtmegatron::moe_router_topk", _backward, setup_context=_setup)


def topk_routing_with_score_function(
    logits,
    topk,
    use_pre_softmax=False,
    num_groups=None,
    group_topk=None,
    scaling_factor=None,
    score_function="softmax",
    expert_bias=None,
    fused=True,
    router_replay=None,
):
    """megatron moe_utils.topk_routing_with_score_function contract; the sigmoid path runs our op, anything
    else falls back to megatron's unfused implementation."""
    if score_function != "sigmoid" or router_replay is not None:
        from megatron.core.transformer.moe import moe_utils

        return moe_utils.topk_routing_with_score_function(
            logits, topk, use_pre_softmax, num_groups, group_topk, scaling_factor, score_function, expert_bias,
            fused=False, router_replay=router_replay,
        )
    return moe_router_topk_op(
        logits, expert_bias, topk, num_groups or 0, group_topk or 0, float(scaling_factor or 1.0)
    )


# ---- TransformerEngine-compatible entry points (what megatron-core's moe_utils calls when
# config.moe_router_fusion is on; bound there by patches/moe_fusion_without_te.py).

def fused_topk_with_score_function(logits, topk, use_pre_softmax=False, num_groups=None, group_topk=None,
                                   scaling_factor=None, score_function="softmax", expert_bias=None):
    """TE `fused_topk_with_score_function` contract: the sigmoid router runs mtmegatron::moe_router_topk, the
    softmax router megatron-core's unfused code (no native kernel for it)."""
    return topk_routing_with_score_function(logits, topk, use_pre_softmax, num_groups, group_topk, scaling_factor,
                                            score_function, expert_bias)


def fused_compute_score_for_moe_aux_loss(logits, topk, score_function):
    """TE contract for the aux-loss scores; megatron-core's unfused formula (plain torch, no native kernel), so
    that moe_router_fusion can be on for routers with a load-balancing loss."""
    from megatron.core.transformer.moe import moe_utils

    return moe_utils.compute_routing_scores_for_aux_loss(logits, topk, score_function, fused=False)


def fused_moe_aux_loss(probs, tokens_per_expert, total_num_tokens, topk, num_experts, coeff):
    """TE contract for the switch load-balancing loss; megatron-core's unfused formula (plain torch)."""
    from megatron.core.transformer.moe import moe_utils

    return moe_utils.switch_load_balancing_loss_func(probs, tokens_per_expert, total_num_tokens, topk, num_experts,
                                                     coeff, fused=False)
