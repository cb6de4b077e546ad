"""The start-up line of a LoRA run: what trains and what stays frozen, over the whole model (every TP and PP
rank), e.g. ``mtmegatron: LoRA r 8 alpha 16 on linear_qkv, linear_proj, linear_fc1, linear_fc2 | trainable 32,768
of 1,012,480 parameters (3.24%) | base frozen: no gradient buffer, no optimizer state`` (exact counts: a test
checks them).

Counts: a TP-sharded parameter counts its shard on each TP rank, a TP-replicated one (a column adapter's A, the
norms) once per TP group, an expert's (under EP) once per expert shard; stages add up over PP (a tied output head counted on both ends, as its storage is).
May assume: called on every rank of the model-parallel group after ``wrap`` (a collective over that group), on
chunks whose parameters live on the device the group communicates on.
"""

from __future__ import annotations

import torch
from megatron.core import parallel_state

from mtmegatron.lora.section import Lora


def counts(chunks) -> tuple[float, float]:
    """(trainable, all) parameters of the whole model: dense ones summed over the model-parallel group, an
    expert's (``allreduce`` False: sharded over EP) over the expert tensor x model x pipeline group."""
    tp = parallel_state.get_tensor_model_parallel_world_size()
    etp = parallel_state.get_expert_tensor_parallel_world_size()
    totals = [0.0, 0.0, 0.0, 0.0]  # dense trainable, dense all, expert trainable, expert all
    device = None
    for chunk in chunks:
        for p in chunk.parameters():
            device = p.device if device is None else device
            expert = not getattr(p, "allreduce", True)
            share = p.numel() if getattr(p, "tensor_model_parallel", False) else p.numel() / (etp if expert else tp)
            totals[2 * expert + 1] += share
            if p.requires_grad:
                totals[2 * expert] += share
    summed = torch.tensor(totals, dtype=torch.float64, device=device)
    dense, expert = summed[:2].clone(), summed[2:].clone()
    torch.distributed.all_reduce(dense, group=parallel_state.get_model_parallel_group())
    torch.distributed.all_reduce(expert, group=parallel_state.get_expert_tensor_model_pipeline_parallel_group())
    return round((dense[0] + expert[0]).item()), round((dense[1] + expert[1]).item())


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
