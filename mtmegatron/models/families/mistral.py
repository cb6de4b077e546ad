"""Mistral v0.3 (``--model mistral``; HF ``MistralForCausalLM``): Llama's layer, a 32K vocabulary, no sliding
window (a config with one shorter than the context is refused). A Mistral training checkpoint's fingerprint reads
as llama3 (the same network).
May assume: what gpt.py assumes.
"""

from __future__ import annotations

import mtmegatron.models.families.gpt as gpt
from mtmegatron.models.families.base import Family

PRESETS = {
    "tiny": dict(gpt.LLAMA_COMMON, **gpt.TINY_DENSE, rotary_base=1000000),
    "7b": dict(gpt.LLAMA_COMMON, num_layers=32, hidden_size=4096, ffn_hidden_size=14336, num_attention_heads=32,
               num_query_groups=8, seq_length=4096, max_position_embeddings=32768, vocab_size=32768,
               rotary_base=1000000),
}


FAMILY = Family(name="mistral", presets=PRESETS, hf_model_type="mistral", hf_architecture="MistralForCausalLM",
                flags_from_hf=lambda config, **_: ["--model", FAMILY.name] + gpt.llama_like_flags(config),
                hf_config=lambda config, build, **_: {**gpt.hf_config_base(FAMILY, config, build), "sliding_window": None},
                hf_map=gpt.decoder_map)
