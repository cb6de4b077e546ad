"""Bytes of training state one rank holds between steps, by component: parameters, gathered (unsharded) weights,
gradients, optimizer state.

Counted from the objects that own them, not from an allocator, so it works on every backend (the cpu backend has
no device allocator): model parameters (a DTensor's local shard), megatron-core DDP's parameter/gradient buffers,
Megatron-FSDP's parameter-group buffers (model weights, main gradients; its main weights, which it keeps beside
the model weights even in an fp32 run and which its DTensor parameters point into, count as optimizer state, as
the distributed optimizer's fp32 copies do), ``main_grad``/``grad`` of each parameter, and the optimizer's
parameters and state. Each storage counts once, for the first component that reaches it, in the order
Megatron-FSDP's weight buffers, DDP's parameter buffers, parameters, gradients, optimizer (a gradient that is a
view into DDP's buffer is that buffer's bytes). "gathered": Megatron-FSDP's parameters whose storage is none of its
buffers, i.e. the all-gathered full weights it keeps between steps (its gather buffers). torch FSDP2 frees gradients
after the step (``zero_grad`` sets them to None), so its gradients between steps are 0: count at the optimizer step
(benchmarks/memory.py does, in a step pre-hook) to see them. ``device_type`` splits the count by where the storages
live: an offload (``--optimizer-cpu-offload``'s host copies, FSDP2's ``--torch-fsdp2-cpu-offload``) moves bytes from
the device's count to ``"cpu"``'s.
May assume: megatron-core 0.16 model chunks (DDP, Megatron-FSDP or torch FSDP2 wrapped) and optimizer.
"""

from __future__ import annotations

import torch

from mtmegatron.training.placement import ddp_buffers

COMPONENTS = ("parameters", "gathered", "gradients", "optimizer")


def _local(tensor):
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def _buffers(chunk, names: tuple[str, ...]):
    """Megatron-FSDP parameter-group buffers (``DataParallelBuffer.data``) of those names."""
    groups = getattr(getattr(chunk, "param_and_grad_buffer", None), "parameter_groups", None) or []
    for group in groups:
        for name in names:
            buffer = getattr(group, name, None)
            if buffer is not None and getattr(buffer, "data", None) is not None:
                yield buffer.data


def _ddp_buffers(chunk, field: str):
    return (getattr(b, field) for _, _, b in ddp_buffers(chunk) if getattr(b, field, None) is not None)


def _owners(model, optimizer):
    """(component, tensor) in claiming order."""
    for chunk in model:
        # Megatron-FSDP's parameters are DTensors over its fp32 main weights even in an fp32 run, beside its model
        # weight buffer: the model weights are the parameters, the main weights the optimizer's copy
        yield from (("parameters", t) for t in _buffers(chunk, ("model_weight_buffer", "transpose_weight_buffer",
                                                                "hsdp_wbuf")))
        yield from (("optimizer", t) for t in _buffers(chunk, ("main_weight_buffer",)))
        yield from (("parameters", t) for t in _ddp_buffers(chunk, "param_data"))
        # a Megatron-FSDP parameter outside its buffers is an all-gathered (unsharded) weight it keeps
        # (with no_shard it has no weight buffer: its parameters are the weights)
        sharded = any(True for _ in _buffers(chunk, ("model_weight_buffer",)))
        gathered = "gathered" if sharded else "parameters"
        for p in chunk.parameters():
            yield gathered, p
    for chunk in model:
        for p in chunk.parameters():
            for attr in ("main_grad", "grad"):
                if getattr(p, attr, None) is not None:
                    yield "gradients", getattr(p, attr)
        yield from (("gradients", t) for t in _ddp_buffers(chunk, "grad_data"))
        yield from (("gradients", t) for t in _buffers(chunk, ("main_grad_buffer", "hsdp_gbuf")))
    for inner in getattr(optimizer, "chained_optimizers", [optimizer]):
        torch_optimizer = getattr(inner, "optimizer", None)
        if torch_optimizer is None:
            continue
        # megatron-core's HybridDeviceOptimizer (--optimizer-cpu-offload): its sub-optimizers hold the host copies
        for torch_opt in (torch_optimizer, *getattr(torch_optimizer, "sub_optimizers", ())):
            for group in torch_opt.param_groups:
                yield from (("optimizer", p) for p in group["params"])
            for state in torch_opt.state.values():
                yield from (("optimizer", v) for v in state.values() if torch.is_tensor(v))


def state_bytes(model, optimizer, device_type: str | None = None) -> dict[str, int]:
    """Bytes per component (COMPONENTS) this rank holds, each storage counted once; with ``device_type`` only the
    storages on devices of that type (``"cpu"``: what an offload keeps on the host)."""
    seen, total = set(), dict.fromkeys(COMPONENTS, 0)
    for component, tensor in _owners(model, optimizer):
        local = _local(tensor)
        if device_type is not None and local.device.type != device_type:
            continue
        storage = local.untyped_storage()
        key = (str(local.device), storage.data_ptr())
        if storage.nbytes() and key not in seen:
            seen.add(key)
            total[component] += storage.nbytes()
    return total
