"""A tiny random HF GPT-OSS (transformers' ``GptOssForCausalLM``, the reference nobody here wrote) saved as a
safetensors checkpoint, with its reference logits, losses and greedy tokens; run as a subprocess.

The config keeps every feature the converter maps, at sizes a 2-core box runs in seconds: 2 layers (sliding,
full), window 4 of a 16-token sequence, GQA (4 heads, 2 KV heads) with head_dim 32 while hidden/heads is 16,
4 experts top-2 of width 32, YaRN (factor 4 over 16 positions, theta 10000: the ramp falls inside the 16
frequencies, ``truncate: false`` as released), ``swiglu_limit`` 0.3 so the clamps cut (the released 7.0 never
does at init scale), sinks of scale 1 so they matter, every bias and norm non-trivial.
``python hf_gpt_oss.py DIR``: checkpoint + ``reference.pt`` (tokens 2 x SEQ, logits).
``python hf_gpt_oss.py --loss DIR BATCH MBS``: helpers/hf_models.py's loss (the same reduction as pretrain).
``python hf_gpt_oss.py --generate DIR OUT.json PROMPT_IDS.json N``: HF greedy ``generate`` of up to N tokens per
prompt (cut before the first end token, id 2).
"""

from __future__ import annotations

import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from helpers.hf_models import SEQ, hf_logits, hf_loss  # noqa: E402


def config(**overrides):
    from transformers import GptOssConfig

    values = dict(vocab_size=128, hidden_size=64, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=32, num_local_experts=4, num_experts_per_tok=2,
                  sliding_window=4, max_position_embeddings=64, rms_norm_eps=1e-5, swiglu_limit=0.3,
                  router_aux_loss_coef=0.0, tie_word_embeddings=False,
                  rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "beta_fast": 32.0,
                                   "beta_slow": 1.0, "truncate": False, "original_max_position_embeddings": 16})
    return GptOssConfig(**{**values, **overrides})


def save_tiny(directory: str):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config(), attn_implementation="eager").float().eval()
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            scale = 1.0 if name.endswith("sinks") else 0.02 if p.dim() > 1 and "bias" not in name else 0.1
            p.copy_(torch.randn(p.shape, generator=gen) * scale + (1.0 if "norm" in name else 0.0))
    model.save_pretrained(directory)
    return model


def main(directory: str) -> None:
    model = save_tiny(directory)
    tokens = torch.randint(0, model.config.vocab_size, (2, SEQ), generator=torch.Generator().manual_seed(7))
    torch.save({"tokens": tokens, "logits": hf_logits(model, tokens)}, os.path.join(directory, "reference.pt"))


def greedy(directory: str, out: str, prompts_file: str, new_tokens: int) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(directory, attn_implementation="eager").float().eval()
    result, eos = [], 2  # helpers/char_tokenizer.py's </s>; the engine stops there and does not return it
    for ids in json.load(open(prompts_file)):
        with torch.no_grad():
            tokens = model.generate(torch.tensor([ids]), max_new_tokens=new_tokens, do_sample=False,
                                    eos_token_id=eos, pad_token_id=eos)[0, len(ids):].tolist()
        result.append(tokens[: tokens.index(eos)] if eos in tokens else tokens)
    json.dump(result, open(out, "w"))


if __name__ == "__main__":
    if sys.argv[1] == "--loss":
        hf_loss(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    elif sys.argv[1] == "--generate":
        greedy(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]))
    else:
        main(sys.argv[1])
