"""Stand-in (see the package docstring): ``newton_schulz_tp``, v0.1.0 API, quintic coefficients."""

from __future__ import annotations

import torch

QUINTIC = [(4.0848, -6.8946, 2.9270), (3.9505, -6.3029, 2.6377), (3.7418, -5.5913, 2.3037),
           (2.8769, -3.1427, 1.2046), (2.8366, -3.0525, 1.2012)]
_recorded = []


def newton_schulz(x: torch.Tensor, steps: int) -> torch.Tensor:
    transposed = x.size(-2) > x.size(-1)
    X = x.mT if transposed else x
    X = X / (X.norm() + 1e-7)
    for i in range(steps):
        a, b, c = QUINTIC[min(i, len(QUINTIC) - 1)]
        A = X @ X.mT
        X = a * X + (b * A + c * A @ A) @ X
    return X.mT if transposed else X


def newton_schulz_tp(x, steps, coefficient_type, tp_group, partition_dim=None, mode="duplicated"):
    if not _recorded:
        from . import record

        record(num_ns_steps=steps, coefficient_type=coefficient_type, tp_mode=mode)
        _recorded.append(True)
    size = 1 if tp_group is None or partition_dim is None else tp_group.size()
    if size == 1:
        return newton_schulz(x, steps)
    # duplicated: every TP rank orthogonalizes the whole matrix and keeps its shard
    parts = [torch.empty_like(x) for _ in range(size)]
    torch.distributed.all_gather(parts, x.contiguous(), group=tp_group)
    full = newton_schulz(torch.cat(parts, dim=partition_dim), steps)
    return full.chunk(size, dim=partition_dim)[tp_group.rank()]
