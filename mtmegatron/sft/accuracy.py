"""Exact-match accuracy of greedy answers on held-out conversations, and the chat samples a run leaves.

Decoding: without pipeline parallelism, inference/recompute.py's greedy loop (whole context re-run per token;
under context parallelism it pads, splits over CP and gathers the logits back), which the KV-cache engine
equals token for token in tests/generate; with pipeline parallelism (one model chunk per rank, no CP), the
held-out prompts go together through megatron-core's static inference engine (inference/engine.py, greedy),
which sends activations stage to stage. Either way an answer is the greedy tokens up to the end-of-document
token, at most ``budget`` of them. An answer is right when its text equals exactly what the chat template
renders for the reference assistant turn (its end-of-turn marks included).
May assume: one model chunk, and no CP together with PP (``can_decode`` says so; the caller checks); every
rank calls (tensor-, context- and pipeline-parallel ranks take part in each forward).
"""

from __future__ import annotations

from megatron.core import parallel_state

from mtmegatron.inference.recompute import greedy_tokens
from mtmegatron.sft.section import Sft


def _prompt_room(sft: Sft, max_new_tokens: int) -> int:
    """How much of a prompt's end is kept so that prompt and answer fit ``--seq-length``."""
    return max(sft.seq_length - max_new_tokens, 1)


def greedy_answer(model, prompt: list[int], max_new_tokens: int, eod: int, sft: Sft) -> list[int]:
    """The greedy answer to ``prompt`` (inference/recompute.py's loop, the reference the KV-cache engine is checked
    against), the prompt's start cut so prompt and answer fit ``--seq-length``."""
    return greedy_tokens(model, prompt[-_prompt_room(sft, max_new_tokens):], max_new_tokens, eod)


def _pipeline_answers(model, tokenizer, prompts: list[list[int]], budgets: list[int], sft: Sft) -> list[list[int]]:
    """Greedy answers of all prompts on megatron-core's static engine (works under PP), each cut at its budget
    and at the end-of-document token."""
    from mtmegatron.inference.engine import Sampling, generate

    longest = max(budgets)
    kept = [p[-_prompt_room(sft, longest):] for p in prompts]
    results, _ = generate(model, tokenizer, [""] * len(kept), kept, Sampling(longest, seed=sft.seed))
    answers = []
    for result, budget in zip(results, budgets):
        tokens = list(result.tokens)[:budget]
        answers.append(tokens[: tokens.index(tokenizer.eod)] if tokenizer.eod in tokens else tokens)
    return answers


def can_decode(model) -> bool:
    return len(model) == 1 and (parallel_state.get_pipeline_model_parallel_world_size() == 1
                                or parallel_state.get_context_parallel_world_size() == 1)


def exact_match(model, template, conversations: list[list[dict]], sft: Sft) -> tuple[float, list[tuple[str, str, str]]]:
    """(accuracy, [(prompt text, generated text, reference text)]) over conversations ending with an answer."""
    tokenizer = template.tokenizer
    prompts_text, references = [], []
    for messages in conversations:
        prompt_text = template.render(messages[:-1], add_generation_prompt=True)
        prompts_text.append(prompt_text)
        references.append(template.render(messages)[len(prompt_text):])
    prompts = [tokenizer.tokenize(p) for p in prompts_text]
    budgets = [len(tokenizer.tokenize(r)) + 2 for r in references]
    model[0].eval()
    try:
        if parallel_state.get_pipeline_model_parallel_world_size() > 1:
            answers = _pipeline_answers(model[0], tokenizer, prompts, budgets, sft)
        else:
            answers = [greedy_answer(model[0], p, b, tokenizer.eod, sft) for p, b in zip(prompts, budgets)]
    finally:
        model[0].train()
    rows = [(p, tokenizer.detokenize(a), r) for p, a, r in zip(prompts_text, answers, references)]
    right = sum(answer == reference for _, answer, reference in rows)
    return right / max(len(conversations), 1), rows


def samples_text(rows: list[tuple[str, str, str]], limit: int) -> str:
    return "".join(f"--- {'right' if answer == reference else 'wrong'} (reference {reference!r})\n"
                   f"{prompt}{answer}\n" for prompt, answer, reference in rows[:limit])
