"""Greedy generation without a KV cache: every new token re-runs the model over the whole sequence so far.

The plain reference the KV-cache engine (engine.py) is checked against, and ``mtmegatron generate
--no-kv-cache`` for when a backend's cached path is in doubt. Each prompt is decoded alone (no padding), logits
gathered over TP by the model (``runtime_gather_output``); under sequence parallelism the input is right-padded
to a multiple of TP (causal attention: padding after the last real token does not change its logits).
May assume: one model chunk, no pipeline or context parallelism (the caller checks), called on every rank.
"""

from __future__ import annotations

import time

import torch
from megatron.core import parallel_state

from mtmegatron.generate.engine import Generation
from mtmegatron.training.device import compute_device


def greedy_tokens(model, prompt_tokens: list[int], max_new_tokens: int, eod: int) -> list[int]:
    tp = parallel_state.get_tensor_model_parallel_world_size()
    sequence_parallel = getattr(model, "config", None) is not None and model.config.sequence_parallel
    device = compute_device()
    generated: list[int] = []
    with torch.no_grad():
        for _ in range(max_new_tokens):
            context = prompt_tokens + generated
            length = len(context)
            padded = -(-length // tp) * tp if sequence_parallel else length
            tokens = torch.full((1, padded), eod, dtype=torch.long, device=device)
            tokens[0, :length] = torch.tensor(context, device=device)
            positions = torch.arange(padded, dtype=torch.long, device=device).unsqueeze(0)
            logits = model(tokens, positions, None, runtime_gather_output=True)
            next_id = int(logits[0, length - 1].float().argmax())
            if next_id == eod:
                break
            generated.append(next_id)
    return generated


def generate_without_cache(model, tokenizer, prompts: list[str], prompt_tokens: list[list[int]],
                           max_new_tokens: int) -> tuple[list[Generation], float]:
    was_training = model.training
    model.eval()
    start = time.perf_counter()
    try:
        out = []
        for prompt, ids in zip(prompts, prompt_tokens):
            tokens = greedy_tokens(model, list(ids), max_new_tokens, tokenizer.eod)
            out.append(Generation(prompt, list(ids), tokens, tokenizer.detokenize(tokens)))
    finally:
        model.train(was_training)
    return out, time.perf_counter() - start
