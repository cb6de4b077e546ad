"""torch FSDP2 saves the gated (SwiGLU) fc1 weight in the checkpoint's global row order at TP1.

Target: megatron.core.transformer.mlp:apply_swiglu_sharded_factory
Reason: a gated MLP's ``linear_fc1`` holds ``[gate; up]`` rows; megatron-core's factory splits each rank's local
rows in two halves and files them as that TP rank's gate and up parts. Under FSDP2 the local rows are a
data-parallel slice of the whole ``[gate; up]`` (rank 0 of DP2: all the gate rows), which the factory files
wrongly: FSDP2 resumed from its own checkpoints, but a DDP run loading one (or FSDP2 loading a DDP one) got the
fc1 rows permuted (measured: weights off by 0.13, the resumed loss off by 0.17 at DP2). At TP1 the local slice
is already in the checkpoint's global order, so the ShardedTensor megatron-core made for it (its offset the
FSDP2 slice's, megatron.core.utils' make_tp_sharded_tensor_for_checkpoint) is kept as it is. Only a fc1 that is
sharded along its rows with TP1 and expert-TP1 (FSDP2's case; DDP's is one fragment, an expert's under expert
TP is split by it) takes this path; FSDP2 with (expert) TP>1 and a gated MLP is refused for checkpoints
(config/fsdp_flags.py).
Versions: megatron-core 0.16.x. Backends: all.
"""

from .base import Patch, current, set_attr

TARGET = "megatron.core.transformer.mlp:apply_swiglu_sharded_factory"


def apply():
    original = current(TARGET)

    def apply_swiglu_sharded_factory(original_sh_ten, sharded_offsets, singleton_local_shards: bool = False):
        from megatron.core import parallel_state

        row_axis = len(sharded_offsets)
        if (not singleton_local_shards and parallel_state.get_tensor_model_parallel_world_size() == 1
                and parallel_state.get_expert_tensor_parallel_world_size() == 1
                and original_sh_ten.axis_fragmentations[row_axis] > 1):
            return original_sh_ten  # FSDP2's row slice of [gate; up]: already the global order
        return original(original_sh_ten, sharded_offsets, singleton_local_shards)

    return set_attr(TARGET, apply_swiglu_sharded_factory)


PATCH = Patch(
    name="torch_fsdp2_swiglu_checkpoint",
    target=TARGET,
    reason="under FSDP2 (TP1) the SwiGLU fc1 factory files each rank's row slice as gate/up halves: checkpoints "
    "held the fc1 rows permuted for DDP; the slice is kept in its global order",
    versions=">=0.16,<0.17",
    apply=apply,
)
