"""Exact-match accuracy of greedy answers on held-out conversations, and the chat samples a run leaves.

``greedy_answer`` is the one place that decodes (greedy, whole context re-run per token, like
training/sampling.py); swapping in megatron-core's inference engine changes only that function. An answer is
right when the generated text, up to the end-of-document token, equals exactly what the chat template renders
for the reference assistant turn (its end-of-turn marks included).
May assume: one model chunk, no pipeline or context parallelism (the caller checks); every rank calls
(tensor-parallel ranks take part in each forward).
"""

from __future__ import annotations

import torch
from megatron.core import parallel_state

from mtmegatron.training.device import compute_device


def greedy_answer(model, prompt: list[int], max_new_tokens: int, eod: int, args) -> list[int]:
    tp = parallel_state.get_tensor_model_parallel_world_size()
    generated: list[int] = []
    device = compute_device()
    with torch.no_grad():
        for _ in range(max_new_tokens):
            context = (prompt + generated)[-args.seq_length:]
            length = len(context)
            padded = -(-length // tp) * tp if args.sequence_parallel else length
            tokens = torch.full((1, padded), eod, dtype=torch.long, device=device)
            tokens[0, :length] = torch.tensor(context, device=device)
            positions = torch.arange(padded, dtype=torch.long, device=device).unsqueeze(0)
            logits = model(tokens, positions, None, runtime_gather_output=True)
            next_id = int(logits[0, length - 1].float().argmax())
            if next_id == eod:
                break
            generated.append(next_id)
    return generated


def can_decode(model) -> bool:
    return (len(model) == 1 and parallel_state.get_pipeline_model_parallel_world_size() == 1
            and parallel_state.get_context_parallel_world_size() == 1)


def exact_match(model, template, conversations: list[list[dict]], args) -> tuple[float, list[tuple[str, str, str]]]:
    """(accuracy, [(prompt text, generated text, reference text)]) over conversations ending with an answer."""
    tokenizer = template.tokenizer
    rows, right = [], 0
    model[0].eval()
    try:
        for messages in conversations:
            prompt_text = template.render(messages[:-1], add_generation_prompt=True)
            reference = template.render(messages)[len(prompt_text):]
            budget = len(tokenizer.tokenize(reference)) + 2
            answer = tokenizer.detokenize(greedy_answer(model[0], tokenizer.tokenize(prompt_text), budget,
                                                        tokenizer.eod, args))
            right += answer == reference
            rows.append((prompt_text, answer, reference))
    finally:
        model[0].train()
    return right / max(len(conversations), 1), rows


def samples_text(rows: list[tuple[str, str, str]], limit: int) -> str:
    return "".join(f"--- {'right' if answer == reference else 'wrong'} (reference {reference!r})\n"
                   f"{prompt}{answer}\n" for prompt, answer, reference in rows[:limit])
