"""torch FSDP2's optimizer state finds its model parameter in a torch_dist checkpoint (seen with torch 2.13).

Target: megatron.core.dist_checkpointing.optimizer:to_local_if_dtensor
Reason: the optimizer's ``sharded_state_dict`` pairs each optimizer state with the model's ShardedTensor of the
same parameter by object identity: ``id(to_local_if_dtensor(param))`` against ``id(sharded_tensor.data)``, the
DTensor's ``_local_tensor`` (megatron.core.utils' make_*sharded_tensor_for_checkpoint). Newer torch's
``DTensor.to_local()`` of a parameter returns a fresh view (to mark it a parameter), whose id matches nothing:
``--use-torch-fsdp2 --save`` fails ("Param id 0 does not match any model sharded param"). In this module
(megatron-core's optimizer-state mapping only) the local shard is the DTensor's own ``_local_tensor``, as the
model side takes it; plain tensors are unchanged.
Versions: megatron-core 0.16.x. Backends: all.
"""

from torch.distributed.tensor import DTensor

from .base import Patch, current, set_attr

TARGET = "megatron.core.dist_checkpointing.optimizer:to_local_if_dtensor"


def local_shard(tensor):
    """The DTensor's local shard itself (not a view of it); any other tensor as it is."""
    return tensor._local_tensor if isinstance(tensor, DTensor) else tensor


def apply():
    current(TARGET)
    return set_attr(TARGET, local_shard)


PATCH = Patch(
    name="torch_fsdp2_optimizer_param_ids",
    target=TARGET,
    reason="newer torch's DTensor.to_local() of a parameter is a fresh view: FSDP2's optimizer state matched no "
    "model ShardedTensor at save ('Param id 0 does not match any model sharded param')",
    versions=">=0.16,<0.17",
    apply=apply,
)
