"""The layer-wise distributed optimizer (``--optimizer dist_muon``) gathers its updated parameters on gloo.

Target: megatron.core.optimizer.layer_wise_optimizer:LayerWiseDistributedOptimizer.allgather_params
Reason: after each step every data-parallel rank holds the updated values of its own whole parameters and
megatron-core all-gathers them with one ``torch.distributed.all_gather`` of unequal sizes (an "all_gather_v":
each rank's parameters differ in size). NCCL accepts that; gloo raises "invalid tensor size" (measured: the first
step of ``--optimizer dist_muon`` at DP2). The replacement pads each rank's flattened parameters to the largest
size, gathers equal sizes, and copies back the unpadded parts exactly as megatron-core does (the other ranks'
parameters only; empty ranks take part with padding only).
Versions: megatron-core 0.16.x. Backends: cpu only (gloo).
"""

from __future__ import annotations

import torch
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from .base import Patch, current, set_attr

TARGET = "megatron.core.optimizer.layer_wise_optimizer:LayerWiseDistributedOptimizer.allgather_params"


def _allgather_padded(params_list, group) -> None:
    rank = group.rank()
    device, dtype = params_list[0][0].device, params_list[0][0].dtype
    sizes = [sum(p.numel() for p in params) for params in params_list]
    padded = max(sizes)
    src = torch.zeros(padded, device=device, dtype=dtype)
    if params_list[rank]:
        src[: sizes[rank]] = _flatten_dense_tensors(params_list[rank])
    gathered = [torch.empty(padded, device=device, dtype=dtype) for _ in params_list]
    torch.distributed.all_gather(gathered, src, group=group)
    for index, (flat, params) in enumerate(zip(gathered, params_list)):
        if not params or index == rank:
            continue
        for updated, model_param in zip(_unflatten_dense_tensors(flat[: sizes[index]], params), params):
            model_param.data.copy_(updated)


def apply():
    current(TARGET)

    @torch.no_grad()
    def allgather_params(self) -> None:
        """All-gather updated params from all ranks (padded to equal sizes for gloo)."""
        if self.pg_collection is None:
            return
        if self.dp_cp_params_list:
            _allgather_padded(self.dp_cp_params_list, self.pg_collection.dp_cp)
        if self.expt_dp_params_list:
            _allgather_padded(self.expt_dp_params_list, self.pg_collection.expt_dp)

    return set_attr(TARGET, allgather_params)


PATCH = Patch(
    name="layer_wise_optimizer_gloo_allgather",
    target=TARGET,
    reason="--optimizer dist_muon all-gathers each rank's updated parameters with unequal sizes, which gloo "
    "refuses; padded to equal sizes on gloo",
    versions=">=0.16,<0.17",
    apply=apply,
    backends=("cpu",),
)
