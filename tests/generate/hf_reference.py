"""``python hf_reference.py FAMILY HF_DIR TOKENIZER_DIR OUT.json MAX_NEW_TOKENS PROMPTS.json``: saves
the tiny random HF model of FAMILY in HF_DIR (tests/helpers/hf_models.py's save_tiny), then runs HF transformers' own
greedy ``generate`` (the reference nobody here wrote) on it for each prompt, plain and as a chat turn.

Plain prompts are encoded by transformers' tokenizer with its defaults; chat prompts by
``apply_chat_template(..., add_generation_prompt=True)``. Each prompt is generated alone (no padding); HF's
output is cut before its first end token (mtmegatron's engine does not return that token). Written as
``{"plain": {"prompt_tokens": [...], "tokens": [...]}, "chat": {...}}``, lists in prompt order. Run in a
subprocess so the test process never runs torch compute before it forks rank processes; the test puts tests/ on
its PYTHONPATH (helpers.child_path) for ``helpers``.
"""

from __future__ import annotations

import json
import sys

import torch


def _tokens(value) -> list[int]:
    """transformers 5 returns a BatchEncoding from apply_chat_template(tokenize=True); older ones a list."""
    return list(value["input_ids"] if hasattr(value, "keys") else value)


def main(family: str, hf_dir: str, tokenizer_dir: str, out: str, max_new_tokens: int, prompts: list[str]) -> None:
    from helpers.hf_models import save_tiny
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir, local_files_only=True)
    model = save_tiny(family, hf_dir)  # the saved model itself, eval, fp32
    eos = tokenizer.eos_token_id
    encoded = {
        "plain": [tokenizer(p)["input_ids"] for p in prompts],
        "chat": [_tokens(tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=True,
                                                       add_generation_prompt=True)) for p in prompts],
    }
    result = {}
    for kind, prompt_tokens in encoded.items():
        generated = []
        for ids in prompt_tokens:
            with torch.no_grad():
                out_ids = model.generate(torch.tensor([ids]), max_new_tokens=max_new_tokens, do_sample=False,
                                         eos_token_id=eos, pad_token_id=eos)[0, len(ids):].tolist()
            generated.append(out_ids[: out_ids.index(eos)] if eos in out_ids else out_ids)
        result[kind] = {"prompt_tokens": prompt_tokens, "tokens": generated}
    with open(out, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    with open(sys.argv[6]) as f:
        main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]), json.load(f))
