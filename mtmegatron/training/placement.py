"""Where the training state lives: every parameter, buffer, gradient buffer and optimizer state of a run on an
accelerator backend must be on ``backend.device(LOCAL_RANK)``; one left on the host is a bug that NCCL/MCCL
reports far away from its cause (or, with a host copy, trains silently wrong). ``misplaced`` lists offenders
by name; ``check`` raises one error naming them. The training loop checks once after the first optimizer step
(when the optimizer state exists). Host scalars that torch keeps on the host by design (Adam's ``step``) are
not training state on the device and are allowed. With ``--optimizer-cpu-offload`` the host-side optimizers of
megatron-core's HybridDeviceOptimizer keep their parameter copies and state on the host by design: those must be
on ``cpu`` instead (and are not counted among the tensors reported on the device); so must the parameter shards
and optimizer state of torch FSDP2 chunks built with a CPU offload policy (``--torch-fsdp2-cpu-offload``).
May assume: DDP- or FSDP-wrapped megatron-core model chunks and a megatron-core optimizer (possibly chained).
"""

from __future__ import annotations

import torch

_HOST_SCALARS = {"step"}  # torch.optim keeps these 0-dim counters on the host unless fused/capturable


def _chunk_tensors(index: int, chunk):
    for name, param in chunk.named_parameters():
        yield f"model[{index}].{name}", param
        main_grad = getattr(param, "main_grad", None)
        if main_grad is not None:
            yield f"model[{index}].{name}.main_grad", main_grad
    for name, buffer in chunk.named_buffers():
        yield f"model[{index}].{name} (buffer)", buffer
    for kind, b, grad_buffer in ddp_buffers(chunk):
        for field in ("grad_data", "param_data"):
            data = getattr(grad_buffer, field, None)
            if data is not None:
                yield f"model[{index}].{kind}[{b}].{field}", data


def ddp_buffers(chunk):
    """(kind, index, buffer) of megatron-core DDP's parameter-and-gradient buffers of a model chunk (none for an
    FSDP wrapper, whose ``buffers`` is ``Module.buffers``)."""
    for kind in ("buffers", "expert_parallel_buffers"):
        found = getattr(chunk, kind, None)
        if isinstance(found, (list, tuple)):
            yield from ((kind, b, buffer) for b, buffer in enumerate(found))


def _offloaded_ids(torch_optimizer) -> set[int]:
    """ids of the host copies and host state of a HybridDeviceOptimizer's host-side optimizers (else empty)."""
    ids = set()
    for sub in getattr(torch_optimizer, "sub_optimizers", []):
        if sub is torch_optimizer.gpu_optimizer:
            continue
        ids.update(id(p) for group in sub.param_groups for p in group["params"])
        ids.update(id(v) for state in sub.state.values() for v in state.values() if torch.is_tensor(v))
    return ids


def _optimizer_tensors(optimizer):
    """(name, tensor, on the host by design) of the optimizer's parameters and state."""
    for o, inner in enumerate(getattr(optimizer, "chained_optimizers", [optimizer])):
        torch_optimizer = getattr(inner, "optimizer", None)
        if torch_optimizer is None:
            continue
        offloaded = _offloaded_ids(torch_optimizer)
        for g, group in enumerate(torch_optimizer.param_groups):
            for p, param in enumerate(group["params"]):
                yield f"optimizer[{o}].param_groups[{g}][{p}]", param, False
        for s, state in enumerate(torch_optimizer.state.values()):
            for key, value in state.items():
                if torch.is_tensor(value) and not (key in _HOST_SCALARS and value.dim() == 0):
                    yield f"optimizer[{o}].state[{s}].{key}", value, id(value) in offloaded


def misplaced(model, optimizer, device: torch.device) -> tuple[int, list[str]]:
    """(number of tensors checked on ``device``, names of those not where they belong: ``device``, or ``cpu``
    for offloaded optimizer state)."""
    checked, wrong = 0, []
    # FSDP2's CPUOffloadPolicy keeps every parameter shard and so every optimizer tensor on the host
    fsdp2_host = any(getattr(getattr(chunk, "ddp_config", None), "offload_policy", None) is not None for chunk in model)
    tensors = [(*t, fsdp2_host and not t[0].endswith("(buffer)"))
               for i, chunk in enumerate(model) for t in _chunk_tensors(i, chunk)]
    if optimizer is not None:
        tensors += [(name, t, offloaded or fsdp2_host) for name, t, offloaded in _optimizer_tensors(optimizer)]
    host = torch.device("cpu")
    for name, tensor, offloaded in tensors:
        checked += not offloaded
        if tensor.device != (host if offloaded else device):
            wrong.append(f"{name} on {tensor.device}" + (" (offloaded: belongs on cpu)" if offloaded else ""))
    return checked, wrong


def check(model, optimizer, device: torch.device) -> int:
    """Raise RuntimeError naming every tensor not on ``device``; returns how many were checked."""
    checked, wrong = misplaced(model, optimizer, device)
    if wrong:
        shown = "; ".join(wrong[:8]) + (f"; ... ({len(wrong) - 8} more)" if len(wrong) > 8 else "")
        raise RuntimeError(f"{len(wrong)} of {checked} training tensors are not on {device}: {shown}")
    return checked
