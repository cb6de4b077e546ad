"""Qwen3 (``--model qwen3``; HF ``Qwen3ForCausalLM``): no bias, RMSNorm on each head's q and k
(``--qk-layernorm``: ``q_norm``/``k_norm``), head dim set explicitly (``--kv-channels``).
May assume: what gpt.py assumes.
"""

from __future__ import annotations

import mtmegatron.models.families.gpt as gpt
from mtmegatron.models.families.base import Family
from mtmegatron.models.families.shared.qwen import QWEN3_COMMON, QWEN3_TINY, qwen3_config

PRESETS = {
    "tiny": dict(QWEN3_COMMON, **QWEN3_TINY, untie_embeddings_and_output_weights=False),
    "0.6b": dict(QWEN3_COMMON, num_layers=28, hidden_size=1024, ffn_hidden_size=3072, num_attention_heads=16,
                 num_query_groups=8, kv_channels=128, untie_embeddings_and_output_weights=False),
    "8b": dict(QWEN3_COMMON, num_layers=36, hidden_size=4096, ffn_hidden_size=12288, num_attention_heads=32,
               num_query_groups=8, kv_channels=128),
    "32b": dict(QWEN3_COMMON, num_layers=64, hidden_size=5120, ffn_hidden_size=25600, num_attention_heads=64,
                num_query_groups=8, kv_channels=128),
}


FAMILY = Family(name="qwen3", presets=PRESETS, hf_model_type="qwen3", hf_architecture="Qwen3ForCausalLM",
                flags_from_hf=lambda config, **_: ["--model", FAMILY.name, *gpt.llama_like_flags(config),
                                                   "--qk-layernorm"],
                hf_config=lambda config, build, **_: qwen3_config(FAMILY, config, build), hf_map=gpt.decoder_map,
                matches=lambda saved: bool(saved.get("qk_layernorm")))
