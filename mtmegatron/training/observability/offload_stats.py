"""Where the optimizer's state lives and what the CPU offload copied: ``offload_stats(optimizer) -> dict``.

Keys (this rank, cumulative since the optimizer was built):
  ``device_state_bytes`` / ``host_state_bytes``: optimizer state (moments, step counters, and master weights
  that are separate tensors, i.e. not the model parameter itself) held by the device-side / host-side
  optimizers. Counted by the role of the optimizer that holds it (on the cpu backend both roles are host memory).
  ``misplaced_state_bytes``: state whose tensor is not where its role says (host-side not on ``cpu``, device-side
  not on the compute device): 0 unless something is wrong. Adam's 0-dim ``step`` counters are host tensors in
  torch's optimizers by design (unless fused/capturable) and are not misplaced on the host for either role.
  ``state_bytes_by_device``: the same state bytes as ``{"device": {"musa:0": n, ...}, "host": {"cpu": n}}``, by
  the role of the optimizer and the device string of each tensor, without those host ``step`` counters, whose
  bytes are ``host_step_bytes`` (so the two maps plus ``host_step_bytes`` sum to device + host state bytes).
  ``offloaded_params`` / ``total_params``: elements of the parameters (this rank's shards) updated on the host / all.
  ``offloaded_tensors``: how many parameter tensors are updated on the host.
  ``d2h_bytes`` / ``h2d_bytes`` and ``d2h_copies`` / ``h2d_copies``: gradient copies to the host and parameter
  copies back to the device made by the offloaded optimizer (weights-only reloads of the host copies count as D2H).
  ``d2h_side_stream_copies`` / ``h2d_side_stream_copies``: those of them made while the optimizer's own side
  stream (``--overlap-cpu-optimizer-d2h-h2d``; not the device's default stream) was the current stream.
  ``fused_adam_calls``: ``mtmegatron::adam_step`` calls by this optimizer's FusedAdams.
  ``offload``: whether a HybridDeviceOptimizer is in use; ``streams``: what its side streams are.
May assume: a megatron-core optimizer from get_megatron_optimizer (chained or not); the patches applied.
"""

from __future__ import annotations

import torch

from mtmegatron.backends.device import compute_device, on_host

KEYS = ("device_state_bytes", "host_state_bytes", "misplaced_state_bytes", "offloaded_params", "total_params",
        "offloaded_tensors", "d2h_bytes", "h2d_bytes", "d2h_copies", "h2d_copies", "d2h_side_stream_copies",
        "h2d_side_stream_copies", "fused_adam_calls", "host_step_bytes")


def inner_optimizers(optimizer) -> list:
    """The torch optimizers inside a megatron optimizer (one per chained optimizer; None for stubs left out)."""
    chained = getattr(optimizer, "chained_optimizers", [optimizer])
    return [o.optimizer for o in chained if getattr(o, "optimizer", None) is not None]


def _is_hybrid(inner) -> bool:
    return hasattr(inner, "sub_optimizers") and hasattr(inner, "gpu_params_map_cpu_copy")


def _state_bytes(sub, host: bool, device_type: str, stats: dict, skip: set) -> None:
    by_device = stats["state_bytes_by_device"]["host" if host else "device"]
    for param, state in sub.state.items():
        for key, value in state.items():
            if not torch.is_tensor(value) or id(value) in skip:
                continue
            nbytes = value.numel() * value.element_size()
            stats["host_state_bytes" if host else "device_state_bytes"] += nbytes
            if key == "step" and value.dim() == 0 and on_host(value.device):
                stats["host_step_bytes"] += nbytes  # torch keeps it on the host by design
                continue
            by_device[str(value.device)] = by_device.get(str(value.device), 0) + nbytes
            if (not on_host(value.device)) if host else value.device.type != device_type:
                stats["misplaced_state_bytes"] += nbytes


def offload_stats(optimizer) -> dict:
    device_type = compute_device().type
    stats = dict.fromkeys(KEYS, 0)
    stats["offload"] = False
    stats["streams"] = "none"
    stats["state_bytes_by_device"] = {"device": {}, "host": {}}
    for inner in inner_optimizers(optimizer):
        if _is_hybrid(inner):
            stats["offload"] = True
            stats["streams"] = ("synchronous (cpu backend: no device streams)" if on_host(device_type) else
                                f"{device_type} side streams" if inner.overlap_cpu_optimizer_d2h_h2d else
                                f"{device_type} current stream")
            # the model parameters themselves are not optimizer state (fp32 params updated in place)
            skip = {id(p) for group in inner.param_groups for p in group["params"]}
            for sub in inner.sub_optimizers:
                _state_bytes(sub, sub is not inner.gpu_optimizer, device_type, stats, skip)
                stats["fused_adam_calls"] += getattr(sub, "num_kernel_calls", 0)
            counters = inner.__dict__.get("_mtm_counters", {})
            for key in ("d2h_bytes", "h2d_bytes", "d2h_copies", "h2d_copies", "d2h_side_stream_copies",
                        "h2d_side_stream_copies"):
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
