"""Where the training state lives: every parameter, buffer, gradient buffer and optimizer state of a run on an
accelerator backend must be on ``backend.device(LOCAL_RANK)``; one left on the host is a bug that NCCL/MCCL
reports far away from its cause (or, with a host copy, trains silently wrong). ``misplaced`` lists offenders
by name; ``check`` raises one error naming them. The training loop checks once after the first optimizer step
(when the optimizer state exists). Host scalars that torch keeps on the host by design (Adam's ``step``) are
not training state on the device and are allowed.
May assume: DDP-wrapped megatron-core model chunks and a megatron-core optimizer (possibly chained).
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
    for kind in ("buffers", "expert_parallel_buffers"):
        for b, grad_buffer in enumerate(getattr(chunk, kind, [])):
            for field in ("grad_data", "param_data"):
                data = getattr(grad_buffer, field, None)
                if data is not None:
                    yield f"model[{index}].{kind}[{b}].{field}", data


def _optimizer_tensors(optimizer):
    for o, inner in enumerate(getattr(optimizer, "chained_optimizers", [optimizer])):
        torch_optimizer = getattr(inner, "optimizer", None)
        if torch_optimizer is None:
            continue
        for g, group in enumerate(torch_optimizer.param_groups):
            for p, param in enumerate(group["params"]):
                yield f"optimizer[{o}].param_groups[{g}][{p}]", param
        for s, state in enumerate(torch_optimizer.state.values()):
            for key, value in state.items():
                if torch.is_tensor(value) and not (key in _HOST_SCALARS and value.dim() == 0):
                    yield f"optimizer[{o}].state[{s}].{key}", value


def misplaced(model, optimizer, device: torch.device) -> tuple[int, list[str]]:
    """(number of tensors checked, names of those not on ``device``)."""
    checked, wrong = 0, []
    tensors = [t for i, chunk in enumerate(model) for t in _chunk_tensors(i, chunk)]
    if optimizer is not None:
        tensors += list(_optimizer_tensors(optimizer))
    for name, tensor in tensors:
        checked += 1
        if tensor.device != device:
            wrong.append(f"{name} on {tensor.device}")
    return checked, wrong


def check(model, optimizer, device: torch.device) -> int:
    """Raise RuntimeError naming every tensor not on ``device``; returns how many were checked."""
    checked, wrong = misplaced(model, optimizer, device)
    if wrong:
        shown = "; ".join(wrong[:8]) + (f"; ... ({len(wrong) - 8} more)" if len(wrong) > 8 else "")
        raise RuntimeError(f"{len(wrong)} of {checked} training tensors are not on {device}: {shown}")
    return checked
