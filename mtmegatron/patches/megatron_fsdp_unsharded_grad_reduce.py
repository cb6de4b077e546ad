"""Megatron-FSDP's gradient reduce of an unsharded gradient buffer: the reduced shard replaces, not adds.

Target: megatron.core.distributed.fsdp.src.megatron_fsdp.param_and_grad_buffer:GradReducePipeline._bucket_group_gradient_reduce
Reason: megatron-core shards a main-grad buffer only under optim_grads / optim_grads_params and only when its group
has more than one rank (``main_buf_dp_group.size() > 1``); otherwise the buffer holds the whole bucket and
``fetch_bucket`` hands back a view of the buffer itself, not a temporary bucket. The reduce then reduce-scatters
that view into a fresh tensor and adds it back into this rank's slice of the same buffer (``local_grad +=
reduced_grad``), so the slice ends up holding its own unreduced gradient plus the reduced one. Measured on the tiny
llama3, 4 micro-batches per step, gradient norm at the first step against DDP + the distributed optimizer's 1.203:
optim_grads and optim_grads_params at data-parallel size 1 (one rank, or TP2 x DP1), where the reduce runs after
every micro-batch and doubles the buffer each time: 10.39 (3.521 vs 1.761 with one micro-batch); optim with
--overlap-grad-reduce, where it runs once at the last micro-batch: 2.405 at DP1, 1.870 at DP2 (losses 0.018 apart at
the third iteration). The replacement reduces such buckets itself with megatron-core's own steps (scale, then
reduce-scatter into a fresh tensor) and copies the result into the slice, as Megatron-LM does after 0.16.1; then marks
them reduced as megatron-core does. Sharded buckets, no_shard and hybrid (outer-DP) reduces go to megatron-core.
Left to megatron-core too: an unsharded bucket under optim_grads(_params) whose scaling factor is not 1 (expert
gradients over a one-rank expert group at data-parallel size > 1): it is reduced after every micro-batch, so the
in-place scaling would compound over the micro-batches; config/fsdp_flags.py refuses that layout.
Versions: megatron-core 0.16.x. Backends: all. The reduce of these buckets runs on the current stream, synchronously.
"""

import torch

from .base import Patch, current, set_attr

BUFFER = "megatron.core.distributed.fsdp.src.megatron_fsdp.param_and_grad_buffer"
TARGET = f"{BUFFER}:GradReducePipeline._bucket_group_gradient_reduce"


def apply():
    import importlib

    buffer_module = importlib.import_module(BUFFER)
    original = current(TARGET)

    def reduced_here(pipeline, bucket_id) -> bool:
        gbuf = pipeline.get_fsdp_buffer(bucket_id)
        strategy = gbuf.ddp_config.data_parallel_sharding_strategy
        return not gbuf.is_data_distributed and (
            strategy == "optim" or (strategy != "no_shard" and gbuf.gradient_scaling_factor in (None, 1.0)))

    def reduce_into_own_slice(pipeline, bucket_id) -> None:
        gbuf = pipeline.get_fsdp_buffer(bucket_id)
        bucket = gbuf.fetch_bucket()  # a view of the buffer itself
        op = buffer_module.gradient_reduce_preprocessing(bucket.data, gbuf.gradient_scaling_factor, gbuf.ddp_config)
        reduced = torch.empty_like(gbuf.get_shard_from_bucket(bucket))
        torch.distributed.reduce_scatter_tensor(reduced, bucket.data, op=op, group=gbuf.data_parallel_group)
        gbuf.get_shard_from_local_buffer().copy_(reduced)
        pipeline.bucket_grad_ready_params[bucket_id] = set()
        pipeline.bucket_status[bucket_id] = buffer_module.BucketStatus.EMPTY

    def _bucket_group_gradient_reduce(self, bucket_group, async_op=False, outer_fsdp_group_grad_reduce=False):
        if outer_fsdp_group_grad_reduce:
            return original(self, bucket_group, async_op, outer_fsdp_group_grad_reduce)
        to_megatron_core = []
        for bucket_id in bucket_group:
            if reduced_here(self, bucket_id):
                reduce_into_own_slice(self, bucket_id)
            else:
                to_megatron_core.append(bucket_id)
        if to_megatron_core:
            return original(self, to_megatron_core, async_op, outer_fsdp_group_grad_reduce)
        return True

    return set_attr(TARGET, _bucket_group_gradient_reduce)


PATCH = Patch(
    name="megatron_fsdp_unsharded_grad_reduce",
    target=TARGET,
    reason="Megatron-FSDP adds an unsharded gradient buffer's reduced slice back onto the same slice (optim_grads(_"
    "params) at DP1: gradient doubled every micro-batch; optim with --overlap-grad-reduce); copy it instead",
    versions=">=0.16,<0.17",
    apply=apply,
)
