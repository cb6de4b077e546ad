"""bf16 training with parameters that live on the host (torch FSDP2's CPUOffloadPolicy): megatron-core's
mixed-precision optimizer accepts them, and its fp32 main copies stay on the host with them.

Target: megatron.core.optimizer.optimizer:Float16OptimizerWithFloat16Params.__init__
Reason: the constructor sorts parameters by ``param.type()`` and accepts only the CUDA names of the half, bf16
and float tensor types (the bridge makes the device's tensors report these names); with
``--torch-fsdp2-cpu-offload`` (patches/torch_fsdp2_cpu_offload.py) each parameter is a DTensor whose shard is a
host tensor, 'torch.BFloat16Tensor', and the constructor raises TypeError at start-up. While it runs, the host
parameters it was given report the CUDA name of their dtype, so it takes them; its fp32 main copy
(``param.detach().clone().float()``) is made where the shard is, on the host, so the main parameters, Adam's state
and the step stay on the host as torch's policy intends. The rest of the step takes host tensors as it is: with
bf16 and no loss scale there is no grad scaler (no found_inf; --fp16 is refused with FSDP2), the grads are copied
with ``.float()``, the main params back with ``copy_`` (bf16 has no multi-tensor overflow buffer), and the gradient
norm and clipping of host gradients are patches/clip_grads_on_host.py's. Not checked (no GPU here): a CUDA
machine with TransformerEngine or apex, whose device-only FusedAdam megatron-core would pick (fp32 offload too).
Measured on the simulated MUSA device, DP2, 4 iterations: bf16 FSDP2 without offload holds 180,800 bytes of bf16
shards and 1,084,800 of main params and moments on the device per rank; with it 0 (1,265,708 on the host), peak
3.03 -> 1.63 MB; losses within 4.05e-5 (the host step runs the native CPU adam_step, the simulated device the op's
Python reference; identical with torch's AdamW); save and resume of the offloaded run continue it exactly.
Versions: megatron-core 0.16.x. Backends: cuda, musa (on the cpu backend the bridge already reports every tensor
with a CUDA name: nothing changes).
"""

from __future__ import annotations

import torch

from .base import Patch, current, set_attr

CUDA_TYPE_PREFIX = "torch.cuda."  # mtm: allow-cuda-name - the type names megatron-core compares parameters with
TARGET = "megatron.core.optimizer.optimizer:Float16OptimizerWithFloat16Params.__init__"


def _host_params(optimizer) -> set[int]:
    from megatron.core.utils import to_local_if_dtensor

    from mtmegatron.backends.device import on_host

    if optimizer is None:
        return set()
    return {id(p) for group in optimizer.param_groups for p in group["params"]
            if on_host(to_local_if_dtensor(p).device)}


def _type_with_cuda_names_for(ids: set[int], original):
    def type(self, dtype=None, non_blocking=False, **kwargs):  # noqa: A001 - mirrors Tensor.type
        name = original(self, dtype, non_blocking, **kwargs)
        if dtype is None and not kwargs and id(self) in ids and not name.startswith(CUDA_TYPE_PREFIX):
            return CUDA_TYPE_PREFIX + name[len("torch."):]
        return name

    return type


def apply():
    init = current(TARGET)

    def __init__(self, optimizer, *args, **kwargs):
        host = _host_params(optimizer)
        if not host:
            return init(self, optimizer, *args, **kwargs)
        tensor_type = torch.Tensor.type
        torch.Tensor.type = _type_with_cuda_names_for(host, tensor_type)
        try:
            return init(self, optimizer, *args, **kwargs)
        finally:
            torch.Tensor.type = tensor_type

    return set_attr(TARGET, __init__)


PATCH = Patch(
    name="float16_optimizer_host_params",
    target=TARGET,
    reason="megatron-core's mixed-precision optimizer accepts only device-typed parameters: FSDP2's CPU-offloaded "
    "bf16 shards are host tensors (their fp32 main copies stay on the host)",
    versions=">=0.16,<0.17",
    apply=apply,
    backends=("cuda", "musa"),
)
