"""torch FSDP2's device mesh on the backend's device type.

Target: megatron.core.distributed.torch_fully_sharded_data_parallel:DeviceMesh
Reason: TorchFullyShardedDataParallel builds its mesh with ``DeviceMesh.from_group(group, "cuda")``; FSDP2 then
expects every parameter on ``cuda:<rank>`` ("Expects the parameter to already be moved to device cuda:0 but got
cpu" on the cpu backend). The module's ``DeviceMesh`` becomes a stand-in whose ``from_group`` puts the mesh on the
active backend's device type (``compute_device().type``); every other use is torch's DeviceMesh.
Versions: megatron-core 0.16.x. Backends: cpu (checked), musa (not yet run on a MUSA device).
"""

from torch.distributed import DeviceMesh

from .base import Patch, current, set_attr

TARGET = "megatron.core.distributed.torch_fully_sharded_data_parallel:DeviceMesh"


class BackendDeviceMesh:
    """``DeviceMesh`` for megatron-core's FSDP2 wrapper, which asks for "cuda": the active backend's device type."""

    @staticmethod
    def from_group(group, device_type, *args, **kwargs):
        from mtmegatron.backends.device import compute_device

        return DeviceMesh.from_group(group, compute_device().type, *args, **kwargs)


def apply():
    current(TARGET)
    return set_attr(TARGET, BackendDeviceMesh)


PATCH = Patch(
    name="torch_fsdp2_device_mesh",
    target=TARGET,
    reason="megatron-core's FSDP2 wrapper builds its DeviceMesh on 'cuda': build it on the backend's device type",
    versions=">=0.16,<0.17",
    apply=apply,
    backends=("cpu", "musa"),
)
