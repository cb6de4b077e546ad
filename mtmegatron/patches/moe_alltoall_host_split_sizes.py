"""MoE alltoall dispatcher: split sizes as host values on the CPU backend.

Target: megatron.core.transformer.moe.token_dispatcher:maybe_move_tensor_to_cpu (the name
MoEAlltoAllTokenDispatcher._maybe_dtoh_and_synchronize calls; defined in moe_utils).
Reason: the dispatcher computes input_splits/output_splits/output_splits_tp as device tensors and relies on
``maybe_move_tensor_to_cpu(t, as_numpy=True)`` to turn them into numpy arrays before
``torch.distributed.all_to_all_single``. The helper only converts tensors with ``is_cuda``; on the CPU
backend the "device" tensors already live on the host, so they stay torch tensors and ProcessGroup's
all_to_all_single (which takes a sequence of ints) raises TypeError. The replacement converts host tensors to
numpy when ``as_numpy`` is asked, exactly what the CUDA path hands on; every other call is unchanged.
Versions: megatron-core 0.16.x. Backends: cpu only (on CUDA/MUSA the tensors are on the device).
"""

import torch

from mtmegatron.backends.device import on_host

from .base import Patch, current, set_attr

TARGET = "megatron.core.transformer.moe.token_dispatcher:maybe_move_tensor_to_cpu"


def apply():
    original = current(TARGET)
    current(TARGET.split(":")[0] + ":MoEAlltoAllTokenDispatcher")  # the caller this patch exists for

    def maybe_move_tensor_to_cpu(tensor, as_numpy=False, record_stream=False):
        if as_numpy and torch.is_tensor(tensor) and on_host(tensor.device):
            return tensor.detach().numpy().copy()  # a copy, like the device-to-host path
        return original(tensor, as_numpy=as_numpy, record_stream=record_stream)

    return set_attr(TARGET, maybe_move_tensor_to_cpu)


PATCH = Patch(
    name="moe_alltoall_host_split_sizes",
    target=TARGET,
    reason="alltoall split sizes stay torch tensors on the CPU backend (is_cuda is False), which "
    "all_to_all_single rejects; convert them to numpy as the CUDA path does",
    versions=">=0.16,<0.17",
    apply=apply,
    backends=("cpu",),
)
