"""Llama-3 / 3.1 / 3.2 (``--model llama3``; HF ``LlamaForCausalLM``): GQA, SwiGLU, RMSNorm, RoPE; 3.1/3.2 add
Llama-3.x RoPE frequency scaling (config/family_args.py; megatron-core's fixed low/high frequency factors 1/4 and
original context 8192 are the published ones) and a 128K context. Its HF map is the plain decoder's (gpt.py).
May assume: what gpt.py assumes.
"""

from __future__ import annotations

import mtmegatron.models.families.gpt as gpt
from mtmegatron.models.families.base import Family

_COMMON = gpt.LLAMA_COMMON
_LLAMA31 = dict(_COMMON, use_rope_scaling=True, rope_scaling_factor=8.0, seq_length=8192,
                max_position_embeddings=131072, vocab_size=128256, rotary_base=500000)
_LLAMA32 = dict(_LLAMA31, rope_scaling_factor=32.0, untie_embeddings_and_output_weights=False)
_REAL = dict(seq_length=8192, max_position_embeddings=8192, vocab_size=128256, rotary_base=500000)

PRESETS = {
    "tiny": dict(_COMMON, **gpt.TINY_DENSE, rotary_base=500000),
    "8b": dict(_COMMON, num_layers=32, hidden_size=4096, ffn_hidden_size=14336, num_attention_heads=32,
               num_query_groups=8, **_REAL),
    "70b": dict(_COMMON, num_layers=80, hidden_size=8192, ffn_hidden_size=28672, num_attention_heads=64,
                num_query_groups=8, **_REAL),
    "3.1-tiny": dict(_LLAMA31, **gpt.TINY_DENSE),
    "3.1-8b": dict(_LLAMA31, num_layers=32, hidden_size=4096, ffn_hidden_size=14336, num_attention_heads=32,
                   num_query_groups=8),
    "3.1-70b": dict(_LLAMA31, num_layers=80, hidden_size=8192, ffn_hidden_size=28672, num_attention_heads=64,
                    num_query_groups=8),
    "3.2-1b": dict(_LLAMA32, num_layers=16, hidden_size=2048, ffn_hidden_size=8192, num_attention_heads=32,
                   num_query_groups=8),
    "3.2-3b": dict(_LLAMA32, num_layers=28, hidden_size=3072, ffn_hidden_size=8192, num_attention_heads=24,
                   num_query_groups=8),
}


FAMILY = Family(name="llama3", presets=PRESETS, **gpt.LLAMA_HF,
                flags_from_hf=lambda config, **_: ["--model", FAMILY.name] + gpt.llama_like_flags(config),
                hf_config=lambda config, build, **_: gpt.llama_hf_config(config, build), hf_map=gpt.decoder_map,
                matches=lambda saved: True)
