"""Greedy-decoded continuations of a few prompts at the end of a run, so a person can see what it learned.

Every rank runs the same decode (tensor-parallel ranks must all take part in each forward; data-parallel
replicas simply repeat it); logits are gathered over TP by the model (``runtime_gather_output``). With
sequence parallelism the input is right-padded to a multiple of TP (causal attention: padding after the last
real token does not change its logits). Pipeline parallelism is not supported here (it would need the
decode loop to pass activations between stages), nor context parallelism (the sequence would have to be
split as in training): the caller skips sampling with a message.
May assume: one model chunk (PP 1), an HF tokenizer from mtmegatron.data.tokenizer, no KV cache (tiny
models; each new token re-runs the whole context, at most seq_length tokens).
"""

from __future__ import annotations

import torch
from megatron.core import parallel_state

from mtmegatron.training.device import compute_device

DEFAULT_PROMPTS = ("In the beginning", "And the LORD said unto Moses,", "Blessed are the")


def greedy_continue(model, tokenizer, prompt: str, num_tokens: int, args) -> str:
    tp = parallel_state.get_tensor_model_parallel_world_size()
    ids = tokenizer.tokenize(prompt)
    generated: list[int] = []
    device = compute_device()
    with torch.no_grad():
        for _ in range(num_tokens):
            context = (ids + generated)[-args.seq_length:]
            length = len(context)
            padded = -(-length // tp) * tp if args.sequence_parallel else length
            tokens = torch.full((1, padded), tokenizer.eod, dtype=torch.long, device=device)
            tokens[0, :length] = torch.tensor(context, device=device)
            positions = torch.arange(padded, dtype=torch.long, device=device).unsqueeze(0)
            logits = model(tokens, positions, None, runtime_gather_output=True)
            next_id = int(logits[0, length - 1].float().argmax())
            if next_id == tokenizer.eod:
                break
            generated.append(next_id)
    return tokenizer.detokenize(generated)


def samples(model, tokenizer, args) -> list[tuple[str, str]] | None:
    """(prompt, continuation) pairs; None when the layout cannot decode (pipeline parallelism)."""
    if (len(model) != 1 or parallel_state.get_pipeline_model_parallel_world_size() > 1
            or parallel_state.get_context_parallel_world_size() > 1):
        return None
    prompts = list(args.sample_prompt or DEFAULT_PROMPTS)[: args.num_samples]
    model[0].eval()
    try:
        return [(p, greedy_continue(model[0], tokenizer, p, args.sample_tokens, args)) for p in prompts]
    finally:
        model[0].train()
