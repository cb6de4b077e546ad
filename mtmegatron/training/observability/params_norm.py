"""``--log-params-norm``: the L2 norm of all model parameters, each counted once, as Megatron-LM's
``calc_params_l2_norm`` (megatron/training/utils.py) computes it.

A parameter replicated over tensor-parallel ranks is counted on TP rank 0 only; a shared one (the tied output
layer on the last stage) once. With --bf16/--fp16 the fp32 master copy the optimizer keeps (``main_param``) is
used where there is one: under the distributed optimizer each data-parallel rank holds a shard of it, summed
over data x context parallel ranks. Dense squares are then summed over the model-parallel group (TP x PP),
expert squares over the expert-tensor x expert x pipeline group.
May assume: called on every rank at the same iteration (collectives); DDP-wrapped model chunks.
"""

from __future__ import annotations

import torch
from megatron.core import parallel_state
from megatron.core.tensor_parallel import param_is_not_tensor_parallel_duplicate
from megatron.core.transformer.module import param_is_not_shared
from torch.distributed.tensor import DTensor

from mtmegatron.backends.device import compute_device


def _sum_of_squares(tensors: list[torch.Tensor], device) -> torch.Tensor:
    """A torch FSDP2 parameter (DTensor) adds its shard's squares summed over its mesh's ranks: on the device,
    where its shard may live on the host (--torch-fsdp2-cpu-offload)."""
    total = torch.zeros(1, dtype=torch.float32, device=device)
    shards: dict = {}  # FSDP2 mesh group -> this rank's squares of its parameters' shards
    for t in tensors:
        if isinstance(t, DTensor):
            group = t.device_mesh.get_group()
            shards[group] = shards.get(group, 0.0) + t.to_local().detach().float().pow(2).sum().to(device)
        else:
            total += t.detach().float().pow(2).sum()
    for group, squares in shards.items():
        squares = squares.reshape(1)
        torch.distributed.all_reduce(squares, group=group)
        total += squares
    return total


def params_l2_norm(model, half_precision: bool) -> float:
    device = compute_device()
    dense, experts, sharded = [], [], []
    for chunk in model:
        for param in chunk.parameters():
            if not param_is_not_tensor_parallel_duplicate(param):
                continue
            is_expert = not getattr(param, "allreduce", True)
            if not is_expert and not param_is_not_shared(param):
                continue
            target = experts if is_expert else dense
            if half_precision and hasattr(param, "main_param"):
                if getattr(param, "main_param_sharded", False):
                    if param.main_param is not None:
                        sharded.append(param.main_param)
                else:
                    target.append(param.main_param)
            else:
                target.append(param)
    dense_sq = _sum_of_squares(dense, device)
    sharded_sq = _sum_of_squares(sharded, device)
    torch.distributed.all_reduce(sharded_sq, group=parallel_state.get_data_parallel_group(with_context_parallel=True))
    dense_sq += sharded_sq
    expert_sq = _sum_of_squares(experts, device)
    dense_group = parallel_state.get_model_parallel_group()
    expert_group = parallel_state.get_expert_tensor_model_pipeline_parallel_group()
    ranks = torch.distributed.get_process_group_ranks
    if ranks(dense_group) == ranks(expert_group):
        dense_sq += expert_sq
        torch.distributed.all_reduce(dense_sq, group=dense_group)
    else:
        torch.distributed.all_reduce(dense_sq, group=dense_group)
        torch.distributed.all_reduce(expert_sq, group=expert_group)
        dense_sq += expert_sq
    return dense_sq.item() ** 0.5
