"""The model fingerprint: every flag that changes parameter shapes or the math of the forward pass.

One list, used by training checkpoints (stored in every checkpoint, compared on ``--load``) and by the HF
converter (stored in its model-only checkpoints), so "the same model" means the same thing everywhere. Not in
it: flags that change how a model is trained or laid out (parallel sizes, dropout, lr, dispatcher, the
router's load-balancing loss, MTP loss scale, FP8) — a checkpoint may legitimately be resumed with other
values of those. ``padded_vocab_size`` is derived (models/vocab.py), stored because it fixes the embedding's
rows. Checkpoints written before a key was added simply lack it: only keys present on both sides are compared.
May assume: ``args`` is a validated pretrain namespace (config/arguments.py).
"""

from __future__ import annotations

FINGERPRINT_FIELDS = (
    # shapes of the dense transformer
    "num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups",
    "vocab_size", "padded_vocab_size", "untie_embeddings_and_output_weights", "disable_bias_linear",
    "kv_channels", "add_qkv_bias",
    # the math of norms, activations and positions
    "normalization", "norm_epsilon", "swiglu", "qk_layernorm", "position_embedding_type", "rotary_base",
    "use_rope_scaling", "rope_scaling_factor", "rope_scaling_low_freq_factor", "rope_scaling_high_freq_factor",
    "rope_scaling_original_max_position_embeddings",
    # MLA and its RoPE (YaRN) scaling
    "multi_latent_attention", "q_lora_rank", "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim",
    "rope_type", "rotary_scaling_factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "mscale",
    "mscale_all_dim",
    # MoE: which layers, how many experts, their sizes, how tokens are routed
    "num_experts", "moe_layer_freq", "moe_ffn_hidden_size", "moe_shared_expert_intermediate_size",
    "moe_router_topk", "moe_router_score_function", "moe_router_enable_expert_bias", "moe_router_num_groups",
    "moe_router_group_topk", "moe_router_topk_scaling_factor",
    # multi-token prediction
    "mtp_num_layers",
    # gated activations beyond SwiGLU, sliding windows and attention sinks (GPT-OSS)
    "quick_geglu", "glu_linear_offset", "activation_func_clamp_value", "window_size", "window_attn_skip_freq",
    "softmax_type",
    # partial rotary (GLM-4.5), (1 + w) norms, Gemma 3's local RoPE base, its softmax scale and the global RoPE's
    # linear scaling
    "rotary_percent", "layernorm_zero_centered_gamma", "rotary_base_local", "query_pre_attn_scalar",
    "rotary_seq_len_interpolation_factor",
)


def _normal(value):
    """Comparable form: an integer size of 0 is "off", as None is (``--q-lora-rank 0``); tuples are lists."""
    if isinstance(value, tuple):
        return list(value)
    if isinstance(value, int) and not isinstance(value, bool) and value == 0:
        return None
    return value


def fingerprint(args) -> dict:
    """``{field: value}`` of ``args`` for every fingerprint field the namespace has."""
    return {k: _normal(getattr(args, k)) for k in FINGERPRINT_FIELDS if hasattr(args, k)}


_ROTARY = ("rope", "mrope", "yarn")
_LLAMA3_SCALING = ("rope_scaling_factor", "rope_scaling_low_freq_factor", "rope_scaling_high_freq_factor",
                   "rope_scaling_original_max_position_embeddings")


def derived(values: dict) -> dict:
    """``values`` with every field Megatron-LM derives filled in as its validate_args (and megatron-core's
    TransformerConfig) derives it, so that a flag left to its default and the value it stands for compare
    equal: the QKV bias whenever linear biases are on (megatron-core builds it either way), ``kv_channels``
    hidden/heads, ``ffn_hidden_size`` 4h (SwiGLU: 2/3 of it rounded down to 64), ``num_query_groups`` the head
    count, ``moe_ffn_hidden_size`` the FFN size; RoPE fields drop out where positions are not rotary, the
    Llama-3.x scaling values where scaling is off; the vocabulary is compared as Megatron-LM compares it, by the
    embedding's rows (``padded_vocab_size``), not the tokenizer's size."""
    out = {k: _normal(v) for k, v in values.items()}
    if out.get("padded_vocab_size") is not None:  # the rows; the vocabulary is the tokenizer's (not compared)
        out.pop("vocab_size", None)
    if out.get("disable_bias_linear") is False:
        out["add_qkv_bias"] = True
    hidden, heads = out.get("hidden_size"), out.get("num_attention_heads")
    if hidden and heads:
        if out.get("kv_channels") is None and "kv_channels" in out and hidden % heads == 0:
            out["kv_channels"] = hidden // heads
        if out.get("num_query_groups") is None and "num_query_groups" in out:
            out["num_query_groups"] = heads
    if hidden and out.get("ffn_hidden_size") is None and "ffn_hidden_size" in out:
        out["ffn_hidden_size"] = int((4 * hidden * 2 / 3) / 64) * 64 if out.get("swiglu") else 4 * hidden
    if out.get("num_experts") and out.get("moe_ffn_hidden_size") is None and "moe_ffn_hidden_size" in out:
        out["moe_ffn_hidden_size"] = out.get("ffn_hidden_size")
    if out.get("position_embedding_type", "rope") not in _ROTARY:
        for k in ("rotary_base", "use_rope_scaling") + _LLAMA3_SCALING:
            out.pop(k, None)
    if not out.get("use_rope_scaling", True):
        for k in _LLAMA3_SCALING:
            out.pop(k, None)
    return out


def mismatches(saved: dict, args) -> dict:
    """``{field: (checkpoint value, run value)}`` for the fields both sides hold whose value differs once each
    side's derived fields are filled in (``derived``)."""
    run, saved = derived(fingerprint(args)), derived(saved)
    return {k: (v, run[k]) for k, v in saved.items() if k in run and v != run[k]}


def describe_mismatches(found: dict, args=None) -> str:
    """``field: checkpoint A vs run B`` for each; the embedding rows (with ``args``) name the flag that fixes it."""
    from mtmegatron.models.vocab import rows_mismatch

    return ", ".join(rows_mismatch(a, args) if k == "padded_vocab_size" and args is not None
                     else f"{k}: checkpoint {a} vs run {b}" for k, (a, b) in found.items())
