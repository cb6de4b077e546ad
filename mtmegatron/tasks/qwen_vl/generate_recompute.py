"""Greedy generation with images without a KV cache: every new token re-runs the language model over the whole
sequence so far (prompt + generated), with the prompt's image embeddings merged and the M-RoPE positions of
generate_prompts.py: the reference the KV-cache path (generate_engine.py) is checked against, and ``mtmegatron
generate --no-kv-cache`` with images.

The vision tower runs once per prompt (its output does not depend on the generated tokens). Each prompt is decoded
alone (no padding); logits gathered over TP by the model (``runtime_gather_output``).
May assume: one model chunk, no pipeline, sequence or context parallelism (generate switches SP off and refuses CP
and PP without a cache), called on every rank with the same prompts.
"""

from __future__ import annotations

import torch

from mtmegatron.backends.device import compute_device
from mtmegatron.inference.engine import Generation
from mtmegatron.inference.recompute import decode_each
from mtmegatron.tasks.qwen_vl.generate_prompts import (VisionPrompt, continued_positions, image_mask, merged_embeddings,
                                                 vision_rows)


def greedy_tokens_with_images(model, prompt_tokens: list[int], vision: VisionPrompt, max_new_tokens: int,
                              eod: int) -> list[int]:
    device = compute_device()
    generated: list[int] = []
    with torch.no_grad():
        rows = vision_rows(model, [vision], device)
        for _ in range(max_new_tokens):
            tokens = torch.tensor([prompt_tokens + generated], dtype=torch.long, device=device)
            positions = continued_positions(vision.positions, tokens.shape[1])[:, None].to(device)
            extra = {}
            if rows is not None:
                extra["decoder_input"] = merged_embeddings(model, tokens, rows,
                                                           image_mask(model, tokens, [len(prompt_tokens)]))
            logits = model(tokens, positions, None, runtime_gather_output=True, **extra)
            next_id = int(logits[0, -1].float().argmax())
            if next_id == eod:
                break
            generated.append(next_id)
    return generated


def generate_with_images_without_cache(model, tokenizer, prompts: list[str], prompt_tokens: list[list[int]],
                                       visions: list[VisionPrompt],
                                       max_new_tokens: int) -> tuple[list[Generation], float]:
    return decode_each(model, tokenizer, prompts, prompt_tokens,
                       lambda i, ids: greedy_tokens_with_images(model, ids, visions[i], max_new_tokens, tokenizer.eod))
