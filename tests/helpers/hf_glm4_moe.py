"""The tiny random HF GLM-4.5 (``Glm4MoeForCausalLM``, the reference nobody here wrote) for tests/convert/test_glm4_moe.py.

``python hf_glm4_moe.py HF_DIR TOKENIZER_DIR``: saves the model's safetensors checkpoint in HF_DIR, a character
tokenizer (helpers/char_tokenizer.py) in TOKENIZER_DIR, and ``HF_DIR/reference.pt``: tokens (2 x SEQ), HF's fp32
logits, and HF's greedy ``generate`` (NEW_TOKENS, cut before the end token) for each of PROMPTS. Run in a
subprocess (no torch compute in the pytest process, which forks rank processes); tests/ must be on PYTHONPATH.

The config keeps every feature the converter maps, each at a value where a mapping mistake shows: q/k/v biases,
q/k RMSNorm, head_dim 32 while hidden/heads is 16, partial rotary 0.5 (RoPE on 16 of 32 channels), one dense
layer then two MoE layers (dense FFN 160, routed 32, shared 2 x 32: sizes differ), the group-limited sigmoid
router (8 experts in 4 groups, 2 groups, top-4) with a non-zero correction bias and a routed scaling factor of
2.5, untied embeddings, and one MTP layer in the release layout (HF's model does not build it; its tensors are
added to the file as DeepSeek-V3's are, helpers/hf_models.py).
"""

from __future__ import annotations

import os
import sys

import torch

SEQ = 16
PROMPTS = ["Hello, world", "Hi"]
NEW_TOKENS = 6
EOS = 2  # the char tokenizer's </s>


def config():
    from transformers import Glm4MoeConfig

    return Glm4MoeConfig(
        vocab_size=128, hidden_size=64, intermediate_size=160, moe_intermediate_size=32, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, n_routed_experts=8, n_shared_experts=2,
        num_experts_per_tok=4, n_group=4, topk_group=2, first_k_dense_replace=1, routed_scaling_factor=2.5,
        norm_topk_prob=True, attention_bias=True, use_qk_norm=True, max_position_embeddings=64,
        num_nextn_predict_layers=1, tie_word_embeddings=False, rms_norm_eps=1e-5, eos_token_id=EOS,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
    )


def save(directory: str):
    """Build, randomise and save the model (+ its MTP layer's tensors); returns it (eval, fp32)."""
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForCausalLM

    from helpers.hf_models import _mtp_tensors, _randomize

    torch.manual_seed(0)
    cfg = config()
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").float().eval()
    _randomize(model)
    model.save_pretrained(directory)
    path = os.path.join(directory, "model.safetensors")
    tensors = load_file(path)
    tensors.update(_mtp_tensors(tensors, cfg, torch.Generator().manual_seed(1)))
    save_file(tensors, path, metadata={"format": "pt"})
    return model


def main(hf_dir: str, tokenizer_dir: str) -> None:
    from transformers import AutoTokenizer

    from helpers.char_tokenizer import save_char_tokenizer

    model = save(hf_dir)
    save_char_tokenizer(tokenizer_dir)
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir, local_files_only=True)
    tokens = torch.randint(0, model.config.vocab_size, (2, SEQ), generator=torch.Generator().manual_seed(7))
    greedy = []
    with torch.no_grad():
        logits = model(input_ids=tokens).logits.float()
        for prompt in PROMPTS:
            ids = tokenizer(prompt)["input_ids"]
            out = model.generate(torch.tensor([ids]), max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=EOS,
                                 pad_token_id=EOS)[0, len(ids):].tolist()
            greedy.append({"prompt_tokens": ids, "tokens": out[: out.index(EOS)] if EOS in out else out})
    torch.save({"tokens": tokens, "logits": logits, "greedy": greedy}, os.path.join(hf_dir, "reference.pt"))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
