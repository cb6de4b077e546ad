"""Megatron-FSDP's gradient reduce on gloo: scale in place, then SUM.

Target: megatron.core.distributed.fsdp.src.megatron_fsdp.param_and_grad_buffer:gradient_reduce_preprocessing
Reason: it folds the 1/data-parallel-size of the gradient average into the collective with
``ReduceOp.PREMUL_SUM`` (``gradient_reduce_div_fusion``, on by default); gloo has no PREMUL_SUM ("Cannot use
ReduceOp.PREMUL_SUM with Gloo"), so every sharded strategy (optim, optim_grads, optim_grads_params) fails at its
first reduce-scatter. The replacement takes megatron-core's own non-fused branch: multiply the gradients by the
scaling factor in place and SUM. (``--ddp-average-in-collective`` asks for ReduceOp.AVG, which gloo lacks too:
refused with Megatron-FSDP on this backend, config/fsdp_flags.py.)
Versions: megatron-core 0.16.x. Backends: cpu (gloo) and musa: whether MCCL takes torch's NCCL-specific PREMUL_SUM
op is unknown (none of Moore Threads' published material says), and scale-then-SUM is the same arithmetic.
"""

import torch

from .base import Patch, current, set_attr

TARGET = "megatron.core.distributed.fsdp.src.megatron_fsdp.param_and_grad_buffer:gradient_reduce_preprocessing"


def apply():
    original = current(TARGET)

    def gradient_reduce_preprocessing(grad_data, scaling_factor, ddp_config):
        if scaling_factor is None or ddp_config.average_in_collective:
            return original(grad_data, scaling_factor, ddp_config)
        grad_data.mul_(scaling_factor)
        return torch.distributed.ReduceOp.SUM

    return set_attr(TARGET, gradient_reduce_preprocessing)


PATCH = Patch(
    name="megatron_fsdp_gloo_grad_reduce",
    target=TARGET,
    reason="gloo has no ReduceOp.PREMUL_SUM: Megatron-FSDP's sharded gradient reduce scales in place, then SUMs",
    versions=">=0.16,<0.17",
    apply=apply,
    backends=("cpu", "musa"),
)
