"""Megatron-FSDP's ``no_shard`` strategy trains (backport of Megatron-LM 80a2d39c93, after core_v0.16.1).

Targets: megatron.core.distributed.fsdp.src.megatron_fsdp.megatron_fsdp:MegatronFSDP.start_param_sync,
megatron.core.distributed.fsdp.src.megatron_fsdp.param_and_grad_buffer:ParamAndGradBuffer.all_reduce_gradients,
megatron.core.optimizer:_get_megatron_optimizer_based_on_param_groups.
Reason: in megatron-core 0.16.1 ``--data-parallel-sharding-strategy no_shard`` fails at the first step on every
backend: ``start_param_sync`` all-gathers a model-weight buffer that no_shard never creates ('NoneType' object
has no attribute 'fetch_bucket'); ``all_reduce_gradients`` skips every gradient buffer that exists (an inverted
``if gbuf is not None: continue``), so no gradient is reduced over data parallelism; and the gradient norm of
the replicated (all-reduced) gradients is summed over the data-parallel ranks too, inflating it. Upstream returns
early from ``start_param_sync`` for no_shard, fixes the inverted test, and reduces no_shard's gradient statistics
over the model-parallel group only; so do these replacements.
Versions: megatron-core 0.16.x. Backends: all.
"""

import torch

from .base import Patch, current, set_attr, undo_in_reverse

FSDP = "megatron.core.distributed.fsdp.src.megatron_fsdp.megatron_fsdp:MegatronFSDP.start_param_sync"
BUFFER = "megatron.core.distributed.fsdp.src.megatron_fsdp.param_and_grad_buffer"
ALL_REDUCE = f"{BUFFER}:ParamAndGradBuffer.all_reduce_gradients"
BUILD = "megatron.core.optimizer:_get_megatron_optimizer_based_on_param_groups"


def _no_shard(ddp_config) -> bool:
    return (ddp_config is not None and ddp_config.use_megatron_fsdp
            and ddp_config.data_parallel_sharding_strategy == "no_shard")


def apply():
    import importlib

    buffer_module = importlib.import_module(BUFFER)
    original_start, original_build = current(FSDP), current(BUILD)
    current(ALL_REDUCE)

    def start_param_sync(self, *unused, force_sync=False, force_dispatch=False):
        if self.data_parallel_sharding_strategy == "no_shard":  # no model-weight buffer to gather
            self._replace_param_with_raw_if_needed()
            return None
        return original_start(self, *unused, force_sync=force_sync, force_dispatch=force_dispatch)

    def all_reduce_gradients(self, async_op: bool = False):
        handles = []
        for group in self.parameter_groups:
            gbuf = group.main_grad_buffer
            if gbuf is None:
                continue
            op = buffer_module.gradient_reduce_preprocessing(gbuf.data, gbuf.gradient_scaling_factor,
                                                             self.ddp_config)
            handle = torch.distributed.all_reduce(gbuf.data, op=op, group=gbuf.data_parallel_group,
                                                  async_op=async_op)
            if async_op:
                handles.append(handle)
        for handle in handles:
            handle.wait()

    def build(config, model_chunks, *args, **kwargs):
        chunk = model_chunks[0] if isinstance(model_chunks, list) else model_chunks  # one chunk per call for FSDP
        if _no_shard(getattr(chunk, "ddp_config", None)) and "model_parallel_group" in kwargs:
            kwargs["intra_dist_opt_group"] = kwargs["model_parallel_group"]  # replicated grads: TP/PP only
        return original_build(config, model_chunks, *args, **kwargs)

    return undo_in_reverse([set_attr(FSDP, start_param_sync), set_attr(ALL_REDUCE, all_reduce_gradients),
                            set_attr(BUILD, build)])


PATCH = Patch(
    name="megatron_fsdp_no_shard",
    target=FSDP,
    reason="Megatron-FSDP no_shard fails at the first step (gathers a weight buffer it never made), reduces no "
    "gradient (inverted check) and sums the grad norm over DP (backport of Megatron-LM 80a2d39c93)",
    versions=">=0.16,<0.17",
    apply=apply,
)
