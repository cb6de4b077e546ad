"""Distributed-optimizer checkpoints ('fully_reshardable') of a gradient buffer split into several buckets.

Target: megatron.core.optimizer.distrib_optimizer:DistributedOptimizer.sharded_param_state_fully_reshardable
Reason: the save gathers each bucket's optimizer state with ``get_parameter_state_dp_zero``, which concatenates
the buckets *without* the padding megatron-core puts at the end of every bucket (so each divides by the DP size),
and then slices every parameter's state out of that tensor with ``buffer.param_index_map`` — whose offsets
count that padding. With one bucket the two agree; from the second bucket on, every parameter's saved master
weight, exp_avg and exp_avg_sq are read from the wrong elements (shifted by the padding of the buckets before
it). The checkpoint looks fine and the resumed run silently trains from corrupted optimizer state. One bucket
is the rule without ``--overlap-grad-reduce``; with it, megatron-core's default bucket is 40M elements, so
every larger model has several. The wrapper hands the slicing code the gathered state laid out in the padded
buffer space (each bucket's data at ``bucket.offset``), which is what its offsets index. Loading is unaffected
(it reads per-parameter model-space tensors).
Versions: megatron-core 0.16.x. Backends: all.
"""

import functools

import torch

from .base import Patch, current, set_attr

TARGET = "megatron.core.optimizer.distrib_optimizer:DistributedOptimizer.sharded_param_state_fully_reshardable"
STATE_KEYS = ("param", "exp_avg", "exp_avg_sq")


def padded_layout(optimizer, state: dict) -> dict:
    """``state`` (get_parameter_state_dp_zero's, buckets concatenated without padding) with every buffer's
    tensors re-laid out in the buffer's padded index space."""
    for gbuf_idx, buffer in enumerate(optimizer.buffers):
        for world in state[gbuf_idx].values():
            if not world:
                continue
            unpadded = 0
            for key in STATE_KEYS:
                packed = world[key]
                laid_out = torch.zeros(buffer.numel, dtype=packed.dtype, device=packed.device)
                unpadded = 0
                for bucket in buffer.buckets:
                    n = bucket.numel_unpadded
                    laid_out[bucket.offset:bucket.offset + n] = packed[unpadded:unpadded + n]
                    unpadded += n
                world[key] = laid_out
            if unpadded != world["numel_unpadded"]:
                raise RuntimeError(f"distributed optimizer buffer {gbuf_idx}: buckets hold {unpadded} elements, the "
                                   f"gathered state {world['numel_unpadded']}; the checkpoint layout changed")
    return state


def apply():
    original = current(TARGET)

    @functools.wraps(original)
    def sharded_param_state_fully_reshardable(self, model_sharded_state_dict, is_loading=False, metadata=None):
        gather = self.get_parameter_state_dp_zero

        def gather_padded(*args, **kwargs):
            state = gather(*args, **kwargs)
            return None if state is None else padded_layout(self, state)

        self.get_parameter_state_dp_zero = gather_padded
        try:
            return original(self, model_sharded_state_dict, is_loading, metadata)
        finally:
            del self.get_parameter_state_dp_zero

    return set_attr(TARGET, sharded_param_state_fully_reshardable)


PATCH = Patch(
    name="distopt_reshardable_bucket_offsets",
    target=TARGET,
    reason="the fully_reshardable save slices bucket-concatenated state with padded buffer offsets: with several "
    "DDP buckets every parameter after the first bucket saved another parameter's optimizer state",
    versions=">=0.16,<0.17",
    apply=apply,
)
