"""The TP all-reduce of sequence-parallel (and qk-layernorm) gradients when those gradients are FSDP2 shards on the
host (torch FSDP2's CPUOffloadPolicy).

Target: megatron.core.distributed.finalize_model_grads:_unshard_if_dtensor and :_reshard_if_dtensor (the helpers
``_allreduce_non_tensor_model_parallel_grads`` and ``_allreduce_embedding_grad`` call by name)
Reason: at TP > 1 megatron-core gathers each such gradient whole (``DTensor.full_tensor``: an all-gather over the
FSDP mesh), all-reduces it over the TP group, then shards it again with ``distribute_tensor`` (a scatter from rank
0, onto the mesh's device). With ``--torch-fsdp2-cpu-offload`` (patches/torch_fsdp2_cpu_offload.py) the shards are
host tensors: the device's collectives refuse them (MCCL/NCCL read device memory only), and the resharded gradient
would land on the device beside a host parameter. Here a host shard is copied to the device before the gather (so
the gather and the TP all-reduce run on the device), and the reduced whole gradient, the same on every rank of the
mesh after the all-reduce, is cut into this rank's shard locally (``src_data_rank=None``: no scatter) and copied
back into the host shard. Device shards take megatron-core's path unchanged.
Versions: megatron-core 0.16.x. Backends: cuda, musa (on the cpu backend the host is the device: nothing changes).
"""

from __future__ import annotations

from .base import Patch, current, set_attr, undo_in_reverse

MODULE = "megatron.core.distributed.finalize_model_grads"
UNSHARD, RESHARD = f"{MODULE}:_unshard_if_dtensor", f"{MODULE}:_reshard_if_dtensor"


def _host_dtensor(tensor) -> bool:
    from torch.distributed.tensor import DTensor

    from mtmegatron.backends.device import on_host

    return isinstance(tensor, DTensor) and on_host(tensor.to_local().device)


def _with_local(reference, local):
    """A DTensor like ``reference`` (mesh, placements, global shape, attributes) over ``local``."""
    from torch.distributed.tensor import DTensor

    out = DTensor.from_local(local, reference.device_mesh, reference.placements, run_check=False,
                             shape=reference.shape, stride=reference.stride())
    for key, value in vars(reference).items():
        setattr(out, key, value)
    return out


def apply():
    unshard, reshard = current(UNSHARD), current(RESHARD)

    def _unshard_if_dtensor(tensor):
        if not _host_dtensor(tensor):
            return unshard(tensor)
        from mtmegatron.backends.device import compute_device

        whole = unshard(_with_local(tensor, tensor.to_local().to(compute_device())))
        for key, value in vars(tensor).items():
            setattr(whole, key, value)
        return whole

    def _reshard_if_dtensor(tensor_to_shard, reference_tensor):
        if not _host_dtensor(reference_tensor):
            return reshard(tensor_to_shard, reference_tensor)
        from torch.distributed.tensor import distribute_tensor

        mine = distribute_tensor(tensor_to_shard, reference_tensor.device_mesh, reference_tensor.placements,
                                 src_data_rank=None).to_local()
        reference_tensor.to_local().copy_(mine)  # the host shard in place (from_local would move it to the device)
        return reference_tensor

    return undo_in_reverse([set_attr(UNSHARD, _unshard_if_dtensor), set_attr(RESHARD, _reshard_if_dtensor)])


PATCH = Patch(
    name="tp_grad_sync_host_shards",
    target=UNSHARD,
    reason="megatron-core's TP all-reduce of sequence-parallel/qk-layernorm gradients gathers and reshards FSDP2 "
    "shards with device collectives: FSDP2's CPU-offloaded shards are host tensors",
    versions=">=0.16,<0.17",
    apply=apply,
    backends=("cuda", "musa"),
)
