"""What the Qwen decoder families share: Qwen's config.json (Qwen2.5's, which Qwen3 and Qwen3-MoE extend), and the
Qwen3 preset fields and config that Qwen3-MoE builds on.
May assume: what gpt.py assumes.
"""

from __future__ import annotations

import mtmegatron.models.families.gpt as gpt
from mtmegatron.models.families.base import Family

QWEN3_COMMON = dict(gpt.LLAMA_COMMON, layernorm_epsilon=1e-6, rotary_base=1000000, qk_layernorm=True,
                    vocab_size=151936, seq_length=4096, max_position_embeddings=40960)
QWEN3_TINY = {**gpt.TINY_DENSE, "kv_channels": 32}  # head dim 32 with hidden 128 / 8 heads = 16, as in the real ones


def qwen_config(family: Family, config, build) -> dict:
    """Qwen's config.json: no attention_bias field, an unused sliding window."""
    out = gpt.hf_config_base(family, config, build)
    del out["attention_bias"]
    out.update(use_sliding_window=False, sliding_window=None)
    return out


def qwen3_config(family: Family, config, build) -> dict:
    """Qwen3's config.json: Qwen's with attention_bias back (false)."""
    return {**qwen_config(family, config, build), "attention_bias": False}
