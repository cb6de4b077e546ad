"""Where the optimizer's state lives and what the CPU offload copied: ``offload_stats(optimizer) -> dict``.

Keys (this rank, cumulative since the optimizer was built):
  ``device_state_bytes`` / ``host_state_bytes``: optimizer state (moments, step counters, and master weights
  that are separate tensors, i.e. not the model parameter itself) held by the device-side / host-side
  optimizers. Counted by the role of the optimizer that holds it (on the cpu backend both roles are host memory).
  ``misplaced_state_bytes``: state whose tensor is not where its role says (host-side not on ``cpu``, device-side
  not on the compute device): 0 unless something is wrong.
  ``offloaded_params`` / ``total_params``: elements of the parameters (this rank's shards) updated on the host / all.
  ``offloaded_tensors``: how many parameter tensors are updated on the host.
  ``d2h_bytes`` / ``h2d_bytes`` and ``d2h_copies`` / ``h2d_copies``: gradient copies to the host and parameter
  copies back to the device made by the offloaded optimizer (weights-only reloads of the host copies count as D2H).
  ``fused_adam_calls``: ``mtmegatron::adam_step`` calls by this optimizer's FusedAdams.
  ``offload``: whether a HybridDeviceOptimizer is in use; ``streams``: what its side streams are.
May assume: a megatron-core optimizer from get_megatron_optimizer (chained or not); the patches applied.
"""

from __future__ import annotations

import torch

from mtmegatron.training.device import compute_device

KEYS = ("device_state_bytes", "host_state_bytes", "misplaced_state_bytes", "offloaded_params", "total_params",
        "offloaded_tensors", "d2h_bytes", "h2d_bytes", "d2h_copies", "h2d_copies", "fused_adam_calls")


def inner_optimizers(optimizer) -> list:
    """The torch optimizers inside a megatron optimizer (one per chained optimizer; None for stubs left out)."""
    chained = getattr(optimizer, "chained_optimizers", [optimizer])
    return [o.optimizer for o in chained if getattr(o, "optimizer", None) is not None]


def _is_hybrid(inner) -> bool:
    return hasattr(inner, "sub_optimizers") and hasattr(inner, "gpu_params_map_cpu_copy")


def _state_bytes(sub, host: bool, device_type: str, stats: dict, skip: set) -> None:
    for param, state in sub.state.items():
        for key, value in state.items():
            if not torch.is_tensor(value) or id(value) in skip:
                continue
            nbytes = value.numel() * value.element_size()
            stats["host_state_bytes" if host else "device_state_bytes"] += nbytes
            if value.device.type != ("cpu" if host else device_type):
                stats["misplaced_state_bytes"] += nbytes


def offload_stats(optimizer) -> dict:
    device_type = compute_device().type
    stats = dict.fromkeys(KEYS, 0)
    stats["offload"] = False
    stats["streams"] = "none"
    for inner in inner_optimizers(optimizer):
        if _is_hybrid(inner):
            stats["offload"] = True
            stats["streams"] = ("synchronous (cpu backend: no device streams)" if device_type == "cpu" else
                                f"{device_type} side streams" if inner.overlap_cpu_optimizer_d2h_h2d else
                                f"{device_type} current stream")
            # the model parameters themselves are not optimizer state (fp32 params updated in place)
            skip = {id(p) for group in inner.param_groups for p in group["params"]}
            for sub in inner.sub_optimizers:
                _state_bytes(sub, sub is not inner.gpu_optimizer, device_type, stats, skip)
                stats["fused_adam_calls"] += getattr(sub, "num_kernel_calls", 0)
            counters = inner.__dict__.get("_mtm_counters", {})
            for key in ("d2h_bytes", "h2d_bytes", "d2h_copies", "h2d_copies"):
                stats[key] += counters.get(key, 0)
            for group in inner.param_groups:
                for p in group["params"]:
                    stats["total_params"] += p.numel()
                    if p in inner.gpu_params_map_cpu_copy:
                        stats["offloaded_params"] += p.numel()
                        stats["offloaded_tensors"] += 1
        else:
            skip = {id(p) for group in inner.param_groups for p in group["params"]}
            _state_bytes(inner, False, device_type, stats, skip)
            stats["fused_adam_calls"] += getattr(inner, "num_kernel_calls", 0)
            stats["total_params"] += sum(p.numel() for group in inner.param_groups for p in group["params"])
    return stats
