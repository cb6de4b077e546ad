"""``python hf_reference.py HF_DIR TOKENIZER_DIR OUT.json MAX_NEW_TOKENS PROMPTS.json``: HF transformers' own
greedy ``generate`` (the reference nobody here wrote) for each prompt, plain and as a chat turn.

Plain prompts are encoded by transformers' tokenizer with its defaults; chat prompts by
``apply_chat_template(..., add_generation_prompt=True)``. Each prompt is generated alone (no padding); HF's
output is cut before its first end token (mtmegatron's engine does not return that token). Written as
``{"plain": {"prompt_tokens": [...], "tokens": [...]}, "chat": {...}}``, lists in prompt order. Run in a
subprocess so the test process never runs torch compute before it forks rank processes.
"""

from __future__ import annotations

import json
import sys

import torch


def _tokens(value) -> list[int]:
    """transformers 5 returns a BatchEncoding from apply_chat_template(tokenize=True); older ones a list."""
    return list(value["input_ids"] if hasattr(value, "keys") else value)


def main(hf_dir: str, tokenizer_dir: str, out: str, max_new_tokens: int, prompts: list[str]) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(hf_dir, attn_implementation="eager").float().eval()
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
    with open(sys.argv[5]) as f:
        main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), json.load(f))
