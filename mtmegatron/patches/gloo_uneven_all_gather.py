"""Uneven all-gather along the first dimension on gloo.

Target: megatron.core.tensor_parallel.mappings:_gather_along_first_dim (called by
gather_from_sequence_parallel_region and the backward of reduce_scatter_to_sequence_parallel_region).
Reason: with ``output_split_sizes`` (ranks holding different numbers of rows, as in the MoE alltoall
dispatcher under TP×EP, where each TP rank receives a different number of tokens) megatron-core calls
``torch.distributed.all_gather`` with unequal output tensors. NCCL accepts that; gloo raises "invalid tensor
size". The replacement does the same gather as an ``all_to_all_single`` in which every rank sends its whole
input to every rank (gloo supports uneven all-to-all); the equal-split path is unchanged.
Versions: megatron-core 0.16.x. Backends: cpu only (gloo).
"""

import torch

from .base import Patch, current, resolve, set_attr

TARGET = "megatron.core.tensor_parallel.mappings:_gather_along_first_dim"


def apply():
    original = current(TARGET)
    owner, _ = resolve(TARGET)
    get_global_memory_buffer = owner.get_global_memory_buffer

    def _gather_along_first_dim(input_, group, output_split_sizes=None, use_global_buffer=False):
        if output_split_sizes is None or group.size() == 1:
            return original(input_, group, output_split_sizes, use_global_buffer)
        output_split_sizes = [int(size) for size in output_split_sizes]
        dim_size = [sum(output_split_sizes), *input_.shape[1:]]
        if use_global_buffer:
            output = get_global_memory_buffer().get_tensor(dim_size, input_.dtype, "mpu")
        else:
            output = torch.empty(dim_size, dtype=input_.dtype, device=input_.device)
        num_ranks = group.size()
        torch.distributed.all_to_all_single(
            output,
            input_.contiguous().repeat(num_ranks, *([1] * (input_.dim() - 1))),
            output_split_sizes=output_split_sizes,
            input_split_sizes=[input_.shape[0]] * num_ranks,
            group=group,
        )
        return output

    return set_attr(TARGET, _gather_along_first_dim)


PATCH = Patch(
    name="gloo_uneven_all_gather",
    target=TARGET,
    reason="gloo's all_gather needs equal tensor sizes; gather uneven splits (MoE alltoall under TP) "
    "with an all_to_all_single instead",
    versions=">=0.16,<0.17",
    apply=apply,
    backends=("cpu",),
)
