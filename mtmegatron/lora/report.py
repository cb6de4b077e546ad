"""The start-up line of a LoRA run: what trains and what stays frozen, over the whole model (every TP and PP
rank), e.g. ``mtmegatron: LoRA r 8 alpha 16 on linear_qkv, linear_proj, linear_fc1, linear_fc2 | trainable 32,768
of 1,012,480 parameters (3.24%) | base frozen: no gradient buffer, no optimizer state`` (exact counts: a test
checks them).

Counts: a TP-sharded parameter counts its shard on each TP rank, a TP-replicated one (a column adapter's A, the
norms) once per TP group; stages add up over PP (a tied output head counted on both ends, as its storage is).
May assume: called on every rank of the model-parallel group after ``wrap`` (a collective over that group), on
chunks whose parameters live on the device the group communicates on.
"""

from __future__ import annotations

import torch
from megatron.core import parallel_state

from mtmegatron.lora.section import Lora


def counts(chunks) -> tuple[float, float]:
    """(trainable, all) parameters of the whole model, summed over the model-parallel group."""
    tp = parallel_state.get_tensor_model_parallel_world_size()
    totals = [0.0, 0.0]
    device = None
    for chunk in chunks:
        for p in chunk.parameters():
            device = p.device if device is None else device
            share = p.numel() if getattr(p, "tensor_model_parallel", False) else p.numel() / tp
            totals[1] += share
            if p.requires_grad:
                totals[0] += share
    summed = torch.tensor(totals, dtype=torch.float64, device=device)
    torch.distributed.all_reduce(summed, group=parallel_state.get_model_parallel_group())
    return round(summed[0].item()), round(summed[1].item())


def line(chunks, lora: Lora) -> str:
    trainable, total = counts(chunks)
    return (f"mtmegatron: LoRA r {lora.lora_r} alpha {lora.lora_alpha:g} on {', '.join(lora.lora_target_modules)} | "
            f"trainable {trainable:,} of {total:,} parameters ({100 * trainable / max(total, 1):.2f}%) | "
            f"base frozen: no gradient buffer, no optimizer state")


def announce(chunks, lora: Lora) -> None:
    """Print ``line`` on global rank 0 (every rank computes it: a collective)."""
    text = line(chunks, lora)
    if torch.distributed.get_rank() == 0:
        print(text, flush=True)
