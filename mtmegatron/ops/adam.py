"""`adam_step`: multi-tensor fused AdamW update of fp32 master params in place (torch.optim.AdamW semantics:
p *= 1 - lr*wd; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2; p -= lr/bc1 * m / (sqrt(v)/sqrt(bc2) + eps)).
Grads may be fp32 or bf16. `step` is the 1-based step count after this update.
May assume: torch >= 2.7; device agnostic.
"""
from __future__ import annotations

import math
from typing import Sequence

import torch

from ._library import define


def adam_step_reference(params, grads, exp_avgs, exp_avg_sqs, lr, beta1, beta2, eps, weight_decay, step):
    bc1 = 1 - beta1**step
    bc2_sqrt = math.sqrt(1 - beta2**step)
    for p, g, m, v in zip(params, grads, exp_avgs, exp_avg_sqs):
        g = g.to(torch.float32)
        p.mul_(1 - lr * weight_decay)
        m.mul_(beta1).add_(g, alpha=1 - beta1)
        v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
        p.addcdiv_(m, v.sqrt().div_(bc2_sqrt).add_(eps), value=-lr / bc1)


adam_step_op = define(
    "adam_step(Tensor(a!)[] params, Tensor[] grads, Tensor(b!)[] exp_avgs, Tensor(c!)[] exp_avg_sqs, float lr,"
    " float beta1, float beta2, float eps, float weight_decay, int step) -> ()",
    adam_step_reference,
)


@torch.library.register_fake("mtmegatron::adam_step")
def _(params, grads, exp_avgs, exp_avg_sqs, lr, beta1, beta2, eps, weight_decay, step):
    return None


def adam_step(
    params: Sequence[torch.Tensor],
    grads: Sequence[torch.Tensor],
    exp_avgs: Sequence[torch.Tensor],
    exp_avg_sqs: Sequence[torch.Tensor],
    *,
    lr: float,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
    weight_decay: float = 0.0,
    step: int,
) -> None:
    """One fused AdamW step over lists of same-length fp32 tensors (updated in place)."""
    adam_step_op(list(params), list(grads), list(exp_avgs), list(exp_avg_sqs), float(lr), float(betas[0]),
                 float(betas[1]), float(eps), float(weight_decay), int(step))
