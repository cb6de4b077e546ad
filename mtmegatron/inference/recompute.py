"""Greedy generation without a KV cache: every new token re-runs the model over the whole sequence so far.

The plain reference the KV-cache engine (engine.py) is checked against, and ``mtmegatron generate
--no-kv-cache`` for when a backend's cached path is in doubt. Each prompt is decoded alone (no padding), logits
gathered over TP by the model (``runtime_gather_output``); under sequence parallelism the input is right-padded
to a multiple of TP (causal attention: padding after the last real token does not change its logits). Under
context parallelism the input is right-padded to a multiple of 2 x CP (x TP with SP), split over the CP ranks
as in training (megatron-core's load-balanced chunks), and the logits are gathered back over the CP group and
put in sequence order, so every rank picks the same token.
May assume: one model chunk, no pipeline parallelism (the caller checks), called on every rank.
"""

from __future__ import annotations

import math
import time

import torch
from megatron.core import parallel_state

from mtmegatron.attention.cp_batch import batch_on_this_cp_rank, thd_partition_index
from mtmegatron.inference.engine import Generation
from mtmegatron.backends.device import compute_device


def _logits_in_sequence_order(model, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """[1, s, vocab] logits; under CP each rank runs its chunks and the shares are gathered back."""
    cp = parallel_state.get_context_parallel_world_size()
    if cp == 1:
        return model(tokens, positions, None, runtime_gather_output=True)
    local = batch_on_this_cp_rank({"tokens": tokens, "position_ids": positions})
    logits = model(local["tokens"], local["position_ids"], None, runtime_gather_output=True).contiguous()
    shares = [torch.empty_like(logits) for _ in range(cp)]
    torch.distributed.all_gather(shares, logits, group=parallel_state.get_context_parallel_group())
    bounds = torch.tensor([0, tokens.shape[1]])
    held = torch.cat([thd_partition_index(bounds, cp, r) for r in range(cp)]).to(logits.device)
    ordered = torch.empty(1, tokens.shape[1], logits.shape[-1], dtype=logits.dtype, device=logits.device)
    ordered[:, held] = torch.cat(shares, dim=1)
    return ordered


def greedy_tokens(model, prompt_tokens: list[int], max_new_tokens: int, eod: int) -> list[int]:
    tp = parallel_state.get_tensor_model_parallel_world_size()
    sequence_parallel = getattr(model, "config", None) is not None and model.config.sequence_parallel
    cp = parallel_state.get_context_parallel_world_size()
    # the padded length splits into 2 x CP chunks, and each CP rank's share splits over TP under SP
    multiple = math.lcm(2 * cp if cp > 1 else 1, cp * tp if sequence_parallel else 1)
    device = compute_device()
    generated: list[int] = []
    with torch.no_grad():
        for _ in range(max_new_tokens):
            context = prompt_tokens + generated
            length = len(context)
            padded = -(-length // multiple) * multiple
            tokens = torch.full((1, padded), eod, dtype=torch.long, device=device)
            tokens[0, :length] = torch.tensor(context, device=device)
            positions = torch.arange(padded, dtype=torch.long, device=device).unsqueeze(0)
            logits = _logits_in_sequence_order(model, tokens, positions)
            next_id = int(logits[0, length - 1].float().argmax())
            if next_id == eod:
                break
            generated.append(next_id)
    return generated


def decode_each(model, tokenizer, prompts: list[str], prompt_tokens: list[list[int]],
                decode) -> tuple[list[Generation], float]:
    """Each prompt decoded alone in eval mode by ``decode(i, prompt ids) -> new ids``; (generations, seconds)."""
    was_training = model.training
    model.eval()
    start = time.perf_counter()
    try:
        out = []
        for i, (prompt, ids) in enumerate(zip(prompts, prompt_tokens)):
            tokens = decode(i, list(ids))
            out.append(Generation(prompt, list(ids), tokens, tokenizer.detokenize(tokens)))
    finally:
        model.train(was_training)
    return out, time.perf_counter() - start


def generate_without_cache(model, tokenizer, prompts: list[str], prompt_tokens: list[list[int]],
                           max_new_tokens: int) -> tuple[list[Generation], float]:
    return decode_each(model, tokenizer, prompts, prompt_tokens,
                       lambda _, ids: greedy_tokens(model, ids, max_new_tokens, tokenizer.eod))
