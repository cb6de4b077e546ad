"""Exact-match accuracy of greedy answers on held-out conversations, and the chat samples a run leaves.

``greedy_answer`` is the one place that decodes: generate/recompute.py's greedy loop (whole context re-run per
token), which the KV-cache engine equals token for token in tests/generate. An answer is
right when the generated text, up to the end-of-document token, equals exactly what the chat template renders
for the reference assistant turn (its end-of-turn marks included).
May assume: one model chunk, no pipeline parallelism (the caller checks); every rank calls (tensor- and
context-parallel ranks take part in each forward; under CP the recompute loop splits and gathers).
"""

from __future__ import annotations

from megatron.core import parallel_state

from mtmegatron.generate.recompute import greedy_tokens


def greedy_answer(model, prompt: list[int], max_new_tokens: int, eod: int, args) -> list[int]:
    """The greedy answer to ``prompt`` (generate/recompute.py's loop, the reference the KV-cache engine is checked
    against), the prompt's start cut so prompt and answer fit ``--seq-length``."""
    keep = max(args.seq_length - max_new_tokens, 1)
    return greedy_tokens(model, prompt[-keep:], max_new_tokens, eod)


def can_decode(model) -> bool:
    return len(model) == 1 and parallel_state.get_pipeline_model_parallel_world_size() == 1


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
