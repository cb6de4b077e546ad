"""Greedy-decoded continuations of a few prompts at the end of a run, so a person can see what it learned.

Decoded on megatron-core's static inference engine with a KV cache (mtmegatron/inference/engine.py: the same
engine as ``mtmegatron generate``), all prompts in one batch. Every rank takes part (TP ranks in each forward,
PP stages pass activations and the last stage's logits are broadcast; data-parallel replicas repeat it);
sequence parallelism is switched off for the decode and back on after it. Prompts are encoded as the training
data was (no special tokens added); the built-in prompts (verses of the embedded corpus) are used only on the
embedded corpus: a run on its own data samples its ``--sample-prompt`` prompts, or says it has none. The new
tokens per prompt are ``--sample-tokens``, fewer when the longest
prompt would otherwise run past ``--max-position-embeddings``.
Not supported, with the reason returned to the caller: interleaved (virtual) pipeline chunks (megatron-core's
inference wrapper runs one chunk per rank), context parallelism (the KV cache is not split over CP ranks) and a
DeepSeek-V3 multi-token-prediction block (it runs in every forward and needs labels).
The values read are ``Samples`` (the sampling flags, by dest) and ``embedded_corpus`` (derived by config/, not a
flag, passed as a plain value).
May assume: called on every rank after training, with an HF tokenizer from mtmegatron.data.tokenizer.
"""

from __future__ import annotations

from dataclasses import dataclass

from megatron.core import parallel_state

from mtmegatron.inference.engine import Sampling, generate
from mtmegatron.utils.section import Section

DEFAULT_PROMPTS = ("In the beginning", "And the LORD said unto Moses,", "Blessed are the")


@dataclass(frozen=True)
class Samples(Section):
    """What the end-of-run samples read."""
    num_samples: int                                    # prompts sampled (0: none)
    sample_prompt: list | None                          # --sample-prompt (repeatable); None: the built-in ones
    sample_tokens: int                                  # new tokens per prompt
    max_position_embeddings: int                        # the prompt plus its new tokens fit these
    mtp_num_layers: int | None                          # a multi-token-prediction block: no samples
    seed: int                                           # the sampler's seed


def unsupported_reason(model, mtp_num_layers: int | None) -> str | None:
    if len(model) != 1:
        return "megatron-core's inference engine does not run interleaved (virtual) pipeline chunks"
    if parallel_state.get_context_parallel_world_size() > 1:
        return "the inference KV cache is not split over context-parallel ranks"
    if mtp_num_layers:
        return ("the multi-token-prediction block runs in every forward of this model and needs labels; save a "
                "checkpoint and use `mtmegatron generate`, which builds the model without it")
    return None


def samples(model, tokenizer, outputs: Samples, embedded_corpus: bool) -> tuple[list[tuple[str, str]] | None, str]:
    """((prompt, continuation) pairs, a note for the header), or (None, why there are none)."""
    reason = unsupported_reason(model, outputs.mtp_num_layers)
    if reason:
        return None, reason
    if not outputs.sample_prompt and not embedded_corpus:
        return None, ("the built-in prompts are verses of the embedded corpus, not of this run's data: "
                      "--sample-prompt TEXT (repeatable) sets prompts")
    prompts = list(outputs.sample_prompt or DEFAULT_PROMPTS)[: outputs.num_samples]
    prompt_tokens = [tokenizer.tokenize(p) for p in prompts]
    room = outputs.max_position_embeddings - max(len(ids) for ids in prompt_tokens)
    num_tokens = min(outputs.sample_tokens, room)
    if num_tokens < 1:
        return None, f"a prompt fills all {outputs.max_position_embeddings} positions of the model"
    chunk = model[0].module if hasattr(model[0], "module") else model[0]  # below DDP: the model's own forward
    results, seconds = generate(chunk, tokenizer, prompts, prompt_tokens, Sampling(num_tokens, seed=outputs.seed))
    generated = sum(len(r.tokens) for r in results)
    note = (f"{num_tokens} tokens each{' (fewer fit the positions)' if num_tokens < outputs.sample_tokens else ''}; "
            f"KV-cache engine, {generated / max(seconds, 1e-9):.1f} tokens/s")
    return [(r.prompt, r.text) for r in results], note
