"""Qwen2 / Qwen2.5 (``--model qwen2.5``; HF ``Qwen2ForCausalLM``): Llama's layer with biases on q/k/v only
(``--add-qkv-bias``; Qwen2 always has them, no attention_bias field), RoPE base 1e6.
May assume: what gpt.py assumes.
"""

from __future__ import annotations

import mtmegatron.models.families.gpt as gpt
from mtmegatron.models.families.base import Family
from mtmegatron.models.families.shared.qwen import qwen_config

_COMMON = dict(gpt.LLAMA_COMMON, layernorm_epsilon=1e-6, rotary_base=1000000, add_qkv_bias=True)
_REAL = dict(seq_length=4096, max_position_embeddings=32768)

PRESETS = {
    "tiny": dict(_COMMON, **gpt.TINY_DENSE, untie_embeddings_and_output_weights=False),
    "0.5b": dict(_COMMON, num_layers=24, hidden_size=896, ffn_hidden_size=4864, num_attention_heads=14,
                 num_query_groups=2, **_REAL, vocab_size=151936, untie_embeddings_and_output_weights=False),
    "7b": dict(_COMMON, num_layers=28, hidden_size=3584, ffn_hidden_size=18944, num_attention_heads=28,
               num_query_groups=4, **_REAL, vocab_size=152064),
    "72b": dict(_COMMON, num_layers=80, hidden_size=8192, ffn_hidden_size=29568, num_attention_heads=64,
                num_query_groups=8, **_REAL, vocab_size=152064),
}


FAMILY = Family(name="qwen2.5", presets=PRESETS, hf_model_type="qwen2", hf_architecture="Qwen2ForCausalLM",
                flags_from_hf=lambda config, **_: ["--model", FAMILY.name, *gpt.llama_like_flags(config),
                                                   "--add-qkv-bias"],
                hf_config=lambda config, build, **_: qwen_config(FAMILY, config, build), hf_map=gpt.decoder_map,
                matches=lambda saved: bool(saved.get("add_qkv_bias")))
