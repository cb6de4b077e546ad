"""Gemma 3 text (``--model gemma3``; HF ``Gemma3ForCausalLM``, model_type ``gemma3_text``): GQA with RMSNorm on
each head's q and k, sliding-window attention on 5 layers of every 6 (``--window-size W-1,0`` with
``--window-attn-skip-freq``), two RoPE bases (``--rotary-base-local`` on the window layers, ``--rotary-base`` and
its linear scaling ``--rotary-seq-len-interpolation-factor`` on the global ones), softmax scale
``1/sqrt(query_pre_attn_scalar)`` (``--query-pre-attn-scalar``), GeGLU with tanh GeLU, ``(1 + w)`` RMSNorm
everywhere (``--apply-layernorm-1p``), four norms per layer, embeddings scaled by sqrt(hidden), tied embeddings.
The layers and the model are this folder's (model.py, built through ``Family.model_builder``); the flags are
flags.py's, the HF config and map hf.py's.

Presets: the text models' shapes of Google's released config.json files (google/gemma-3-1b-pt for 1b; the
``text_config`` of google/gemma-3-{4b,12b,27b}-pt for the others), as I know them: hidden / intermediate / layers /
heads / kv heads / head_dim 1152/6912/26/4/1/256 (1b), 2560/10240/34/8/4/256 (4b), 3840/15360/48/16/8/256 (12b),
5376/21504/62/32/16/128 (27b); sliding window 512 (1b) and 1024 (the others), pattern 6; rope_theta 1e6 (global;
linear scaling factor 8 on 4b/12b/27b), rope_local_base_freq 1e4; query_pre_attn_scalar 256, 168 for 27b
(hidden/heads); rms_norm_eps 1e-6; vocabulary 262,144 (1b) and 262,208; 32K (1b) and 128K positions.
May assume: what gpt.py assumes; model.py is imported only when a model is built.
"""

from __future__ import annotations

from mtmegatron.models.families.base import Family
from mtmegatron.models.families.gemma3 import hf

_COMMON = dict(normalization="RMSNorm", layernorm_epsilon=1e-6, layernorm_zero_centered_gamma=True,
               position_embedding_type="rope", add_bias_linear=False, untie_embeddings_and_output_weights=False,
               group_query_attention=True, qk_layernorm=True, rotary_base=1000000, rotary_base_local=10000.0,
               window_attn_skip_freq=6, seq_length=4096)
_LARGE = dict(_COMMON, vocab_size=262208, max_position_embeddings=131072, rotary_seq_len_interpolation_factor=8,
              window_size=(1023, 0))

PRESETS = {
    # 6 layers: one 5-local : 1-global period; head dim 32 (not hidden/heads = 16), scale 1/sqrt(24), window 8
    "tiny": dict(_COMMON, num_layers=6, hidden_size=128, ffn_hidden_size=352, num_attention_heads=8,
                 num_query_groups=4, kv_channels=32, query_pre_attn_scalar=24.0, window_size=(7, 0),
                 seq_length=128, max_position_embeddings=128, vocab_size=1024),
    "1b": dict(_COMMON, num_layers=26, hidden_size=1152, ffn_hidden_size=6912, num_attention_heads=4,
               num_query_groups=1, kv_channels=256, query_pre_attn_scalar=256.0, window_size=(511, 0),
               vocab_size=262144, max_position_embeddings=32768),
    "4b": dict(_LARGE, num_layers=34, hidden_size=2560, ffn_hidden_size=10240, num_attention_heads=8,
               num_query_groups=4, kv_channels=256, query_pre_attn_scalar=256.0),
    "12b": dict(_LARGE, num_layers=48, hidden_size=3840, ffn_hidden_size=15360, num_attention_heads=16,
                num_query_groups=8, kv_channels=256, query_pre_attn_scalar=256.0),
    "27b": dict(_LARGE, num_layers=62, hidden_size=5376, ffn_hidden_size=21504, num_attention_heads=32,
                num_query_groups=16, kv_channels=128, query_pre_attn_scalar=168.0),
}


def _build(config, build, choice, fusions):
    from mtmegatron.models.families.gemma3.model import build_gemma3_chunks

    return build_gemma3_chunks(config, build, choice, fusions)


FAMILY = Family(name="gemma3", presets=PRESETS, hf_model_type="gemma3_text", hf_architecture="Gemma3ForCausalLM",
                flags_from_hf=lambda config, **_: ["--model", FAMILY.name, *hf.flags_from_hf(config)],
                hf_config=lambda config, build, **_: hf.hf_config(FAMILY, config, build), hf_map=hf.hf_map,
                matches=lambda saved: saved.get("query_pre_attn_scalar") is not None, model_builder=_build)
