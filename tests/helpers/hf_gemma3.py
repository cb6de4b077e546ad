"""A tiny random HF Gemma 3 text model (``Gemma3ForCausalLM``, transformers' own code as the reference) and what
the Gemma 3 tests compare against, made in a subprocess (no torch compute in a pytest process that forks ranks).

``python hf_gemma3.py DIR TOKENIZER_DIR``: the checkpoint and ``reference.pt``: tokens 2 x SEQ and HF's fp32 logits,
and HF's greedy ``generate`` of NEW tokens for PROMPT encoded by the character tokenizer in TOKENIZER_DIR
(tests/helpers/char_tokenizer.py; cut before its end token, as tests/generate/hf_reference.py does).
``python hf_gemma3.py --loss DIR BATCH MBS``: HF's loss on a pretrain batch (hf_models.hf_loss). The config keeps every Gemma 3 feature at a size where each
shows in the logits: 6 layers (5 sliding : 1 global), window 4 < SEQ 16, head_dim 32 != hidden/heads 16,
query_pre_attn_scalar 24 != head_dim, two RoPE bases with linear scaling 8 on the global layer, GQA, tied
embeddings, every norm weight non-zero.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

SEQ, NEW = 16, 6
PROMPT = "Hello, world"
HERE = Path(__file__)


def config():
    from transformers import Gemma3TextConfig

    return Gemma3TextConfig(
        vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=6, num_attention_heads=4,
        num_key_value_heads=2, head_dim=32, query_pre_attn_scalar=24, sliding_window=4, max_position_embeddings=64,
        rms_norm_eps=1e-6, tie_word_embeddings=True, pad_token_id=0, bos_token_id=2, eos_token_id=1,
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                         "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0}})


def _randomize(model) -> None:
    """Non-trivial values everywhere: matrices N(0, 0.02), the (1 + w) norms' w N(0, 0.2)."""
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for _, p in model.named_parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * (0.02 if p.dim() > 1 else 0.2))


def save(directory: str, tokenizer_dir: str) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config(), attn_implementation="eager").float().eval()
    _randomize(model)
    model.save_pretrained(directory)
    tokens = torch.randint(3, 128, (2, SEQ), generator=torch.Generator().manual_seed(7))
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir, local_files_only=True)
    prompt = tokenizer(PROMPT)["input_ids"]
    eos = tokenizer.eos_token_id
    with torch.no_grad():
        logits = model(input_ids=tokens).logits.float()
        generated = model.generate(torch.tensor([prompt]), max_new_tokens=NEW, do_sample=False, eos_token_id=eos,
                                   pad_token_id=eos)[0, len(prompt):].tolist()
    generated = generated[: generated.index(eos)] if eos in generated else generated
    torch.save({"tokens": tokens, "logits": logits, "prompt_tokens": prompt, "generated": generated},
               os.path.join(directory, "reference.pt"))


def save_reference(directory: Path, tokenizer_dir: Path, env: dict) -> None:
    proc = subprocess.run([sys.executable, str(HERE), str(directory), str(tokenizer_dir)], capture_output=True,
                          text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]


if __name__ == "__main__":
    if sys.argv[1] == "--loss":
        sys.path.insert(0, str(HERE.parents[1]))  # tests/: the helpers package, as the other HF helpers import it
        from helpers.hf_models import hf_loss

        hf_loss(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    else:
        save(sys.argv[1], sys.argv[2])
