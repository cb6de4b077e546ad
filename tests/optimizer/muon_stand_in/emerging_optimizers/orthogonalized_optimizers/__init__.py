"""Stand-in (see the package docstring): ``OrthogonalizedOptimizer`` and ``get_muon_scale_factor``, v0.1.0 API."""

from __future__ import annotations

import json
import os
from typing import Callable

import torch

from .muon_utils import newton_schulz_tp  # noqa: F401  (megatron-core imports it from muon_utils)

RECORD_ENV = "MUON_STAND_IN_RECORD"


def record(**values) -> None:
    path = os.environ.get(RECORD_ENV)
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(values) + "\n")


def get_muon_scale_factor(size_out: int, size_in: int, mode: str = "spectral") -> float:
    if mode == "shape_scaling":
        return max(1, size_out / size_in) ** 0.5
    if mode == "spectral":
        return max(size_out, size_in) ** 0.5
    if mode == "unit_rms_norm":
        return (size_out / size_in) ** 0.5
    raise ValueError(f"Invalid mode for Muon update scale factor: {mode}")


class OrthogonalizedOptimizer(torch.optim.Optimizer):
    def __init__(self, params, lr: float, momentum_beta: float, weight_decay: float, *, use_nesterov: bool,
                 weight_decay_method: str, fp32_matmul_prec: str, scaled_orthogonalize_fn: Callable | None = None,
                 **kwargs):
        self.use_nesterov = use_nesterov
        self.weight_decay_method = weight_decay_method
        self.fp32_matmul_prec = fp32_matmul_prec
        self.scaled_orthogonalize_fn = scaled_orthogonalize_fn or (lambda grad: grad)
        self._recorded = False
        super().__init__(params, dict(lr=lr, momentum_beta=momentum_beta, weight_decay=weight_decay, **kwargs))

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            if not self._recorded:
                record(momentum_beta=group["momentum_beta"], use_nesterov=self.use_nesterov,
                       weight_decay_method=self.weight_decay_method, fp32_matmul_prec=self.fp32_matmul_prec)
                self._recorded = True
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = p.grad
                if self.weight_decay_method == "decoupled":
                    p.mul_(1 - group["lr"] * group["weight_decay"])
                else:
                    grad = grad + group["weight_decay"] * p
                state = self.state[p]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(grad)
                exp_avg = state["momentum_buffer"]
                exp_avg.lerp_(grad, 1 - group["momentum_beta"])
                update = grad.lerp(exp_avg, group["momentum_beta"]) if self.use_nesterov else exp_avg
                update = self.orthogonalize(p, update, **{k: v for k, v in group.items() if k != "params"})
                p.add_(update, alpha=-group["lr"])
        return loss

    def orthogonalize(self, p, grad, **kwargs):
        return self.scaled_orthogonalize_fn(grad)
