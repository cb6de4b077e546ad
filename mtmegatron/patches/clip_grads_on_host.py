"""Gradient norm and clipping of gradients that live on the host (torch FSDP2's CPUOffloadPolicy).

Target: megatron.core.optimizer.optimizer:get_grad_norm_fp32 and :clip_grad_by_total_norm_fp32 (the names
megatron-core's optimizers call)
Reason: with ``--torch-fsdp2-cpu-offload`` (patches/torch_fsdp2_cpu_offload.py) each parameter's gradient shard is
a host tensor, by design: the optimizer steps on the host. megatron-core's clipping asserts that each gradient's
type string is the device's float tensor type (AssertionError at the first step on musa) and both functions
hand the gradients to apex/TransformerEngine's multi-tensor kernels when those are installed, which take device
tensors only. When any gradient is a host tensor on a device backend, the norm is taken with torch ops the way
megatron-core's own fallback does (each tensor's 2-norm, then the norm of those; or the max for inf), moved to
the device for megatron-core's all-reduces (over the gradients' FSDP group, then ``grad_stats_parallel_group``),
and the clipping scales the host gradients in place; device gradients take megatron-core's path unchanged.
Versions: megatron-core 0.16.x. Backends: cuda, musa (on the cpu backend the host is the device: nothing changes).
"""

from __future__ import annotations

import math

import torch

from .base import Patch, current, set_attr, undo_in_reverse

MODULE = "megatron.core.optimizer.optimizer"
NORM, CLIP = f"{MODULE}:get_grad_norm_fp32", f"{MODULE}:clip_grad_by_total_norm_fp32"


def _local(tensor):
    from megatron.core.utils import to_local_if_dtensor

    return to_local_if_dtensor(tensor)


def _any_on_host(tensors) -> bool:
    from mtmegatron.backends.device import on_host

    return any(on_host(_local(t).device) for t in tensors)


def host_grad_norm(grads, norm_type, grad_stats_parallel_group):
    """megatron-core's get_grad_norm_fp32 semantics for gradients some of which are host tensors."""
    from megatron.core.utils import get_data_parallel_group_if_dtensor

    from mtmegatron.backends.device import compute_device

    dp_group = None
    for grad in grads:
        dp_group = get_data_parallel_group_if_dtensor(grad, dp_group)
    local = [_local(g) for g in grads]
    norm_type = float(norm_type)
    if norm_type == math.inf:
        op = torch.distributed.ReduceOp.MAX
        total = torch.tensor([max((float(g.abs().max()) for g in local), default=0.0)])
    else:
        op = torch.distributed.ReduceOp.SUM
        norms = torch.tensor([float(torch.norm(g, norm_type)) for g in local] or [0.0])
        # 2-norm: the norm of the per-tensor norms, as megatron-core's fallback l2 kernel; else the sum of powers
        total = (torch.norm(norms) ** 2 if norm_type == 2.0 else (norms ** norm_type).sum()).reshape(1)
    total = total.to(compute_device(), torch.float)
    if dp_group:
        torch.distributed.all_reduce(total, op=op, group=dp_group)
    torch.distributed.all_reduce(total, op=op, group=grad_stats_parallel_group)
    return total.item() if norm_type == math.inf else total.item() ** (1.0 / norm_type)


def apply():
    norm, clip = current(NORM), current(CLIP)

    def get_grad_norm_fp32(grads_for_norm, norm_type=2, grad_stats_parallel_group=None):
        grads = [grads_for_norm] if isinstance(grads_for_norm, torch.Tensor) else list(grads_for_norm)
        if not _any_on_host(grads):
            return norm(grads, norm_type, grad_stats_parallel_group)
        return host_grad_norm(grads, norm_type, grad_stats_parallel_group)

    def clip_grad_by_total_norm_fp32(parameters, max_norm, total_norm, use_decoupled_grad=False):
        params = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
        attr = "decoupled_grad" if use_decoupled_grad else "grad"
        grads = [getattr(p, attr) for p in params if getattr(p, attr, None) is not None]
        if not _any_on_host(grads):
            return clip(params, max_norm, total_norm, use_decoupled_grad)
        allowed = (torch.float32, torch.bfloat16) if use_decoupled_grad else (torch.float32,)
        assert all(g.dtype in allowed for g in grads), [g.dtype for g in grads]
        clip_coeff = max_norm / (total_norm + 1.0e-6)
        if clip_coeff < 1.0:
            for grad in grads:
                local = _local(grad).detach()
                local.copy_(local * clip_coeff)  # megatron-core's fallback multi_tensor_scale, on the host
        return None

    return undo_in_reverse([set_attr(NORM, get_grad_norm_fp32), set_attr(CLIP, clip_grad_by_total_norm_fp32)])


PATCH = Patch(
    name="clip_grads_on_host",
    target=CLIP,
    reason="megatron-core's gradient clipping asserts device-typed gradients and its norm/scale kernels take "
    "device tensors: FSDP2's CPU-offloaded gradients are host tensors",
    versions=">=0.16,<0.17",
    apply=apply,
    backends=("cuda", "musa"),
)
