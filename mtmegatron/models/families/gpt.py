"""The generic GPT decoder (``--model gpt``: a plain Megatron-LM command line) and what every HF decoder family
shares: the Llama-style preset fields and training recipe, the HF config helpers, and the decoder's HF map.

HF config facts: Llama/Mixtral/Mistral/Qwen have no biases except Qwen2's on q/k/v (``--add-qkv-bias``); a head_dim
other than hidden/heads is ``--kv-channels``; Llama-3.x ``rope_scaling`` (type ``llama3``) is megatron-core's
``--use-rope-scaling`` with the config's own frequency factors and original context
(patches/llama3_rope_scaling_values.py). Every model value is explicit in the flags so no preset value leaks in;
a config field that changes the math and has no equivalent is refused (``check_representable``).
Map facts: ``linear_qkv`` rows are grouped per query group: that group's query heads, then its key, then its value
(its bias, Qwen2's, likewise); Qwen3's ``q_norm``/``k_norm`` -> ``q_layernorm``/``k_layernorm``; ``linear_fc1`` is
``cat([gate, up])``; experts are ``mlp.experts.local_experts.<e>`` (sequential experts), the router ``mlp.router``.
May assume: megatron-core's TransformerConfig and models/section.py's ModelBuild of the same network, filled by
convert/ from its parsed flags; plain dicts for config.json.
"""

from __future__ import annotations

import torch

from mtmegatron.models.families.base import ConversionError, Entry, Family
from mtmegatron.models.moe_layers import moe_layer_pattern

LLAMA_COMMON = dict(normalization="RMSNorm", layernorm_epsilon=1e-5, swiglu=True, position_embedding_type="rope",
                    add_bias_linear=False, untie_embeddings_and_output_weights=True,
                    group_query_attention=True)
LLAMA_HF = dict(hf_model_type="llama", hf_architecture="LlamaForCausalLM")  # llama3's, LLaVA's language model's
TINY_DENSE = dict(num_layers=4, hidden_size=128, ffn_hidden_size=352, num_attention_heads=8, num_query_groups=4,
                  seq_length=128, max_position_embeddings=128, vocab_size=1024)
# The training recipe every named preset carries (the demo's: a short cosine run of small batches without
# dropout), for the values Megatron-LM leaves unset (lr, batch sizes, iterations) or sets for large models
# (dropout 0.1, beta2 0.999, linear decay, 100 evaluation batches, a console line every 100 iterations).
RECIPE = dict(
    train_iters=1000, lr=1e-3, lr_decay_style="cosine", adam_beta2=0.95, micro_batch_size=2, global_batch_size=8,
    hidden_dropout=0.0, attention_dropout=0.0, eval_iters=4, log_interval=1,
)
# megatron-core's RotaryEmbedding._apply_scaling defaults (mtmegatron's flags, not Megatron-LM's)
LLAMA3_SCALING_DEFAULTS = {"rope_scaling_low_freq_factor": 1.0, "rope_scaling_high_freq_factor": 4.0,
                           "rope_scaling_original_max_position_embeddings": 8192}
# Llama-3.x rope_scaling fields -> their flags (defaults: megatron-core's RotaryEmbedding._apply_scaling's)
LLAMA3_ROPE_FLAGS = {"low_freq_factor": "rope_scaling_low_freq_factor", "high_freq_factor":
                     "rope_scaling_high_freq_factor",
                     "original_max_position_embeddings": "rope_scaling_original_max_position_embeddings"}


# ---- HF config.json -> flags ----------------------------------------------------------------------------------
def rope(config: dict) -> tuple[float, dict | None]:
    """(rope theta, scaling dict or None) from either transformers-5 ``rope_parameters`` or the older keys."""
    params = dict(config.get("rope_parameters") or {})
    scaling = dict(config.get("rope_scaling") or {})
    theta = params.get("rope_theta", config.get("rope_theta", 10000.0))
    kind = params.get("rope_type") or scaling.get("rope_type") or scaling.get("type") or "default"
    if kind == "default":
        return theta, None
    return theta, {**scaling, **params, "rope_type": kind}


def require(condition: bool, message: str) -> None:
    if not condition:
        raise ConversionError(message)


# config.json fields that change the math, with the values we can represent (absent = the HF default).
# Anything else is refused with one message naming the field, never converted silently wrong.
_REPRESENTABLE = {
    "attention_bias": (False, None), "mlp_bias": (False, None),
    "sliding_window": (None,), "use_sliding_window": (False, None), "partial_rotary_factor": (1.0, None),
    "topk_method": ("noaux_tc", None), "moe_layer_freq": (1, None), "layer_types": (None,),
    "decoder_sparse_step": (1, None), "mlp_only_layers": ([], None), "shared_expert_intermediate_size": (0, None),
}


def check_representable(config: dict) -> None:
    """Refuse the first config field whose value changes the math in a way our model cannot reproduce."""
    for field, allowed in _REPRESENTABLE.items():
        value = config.get(field)
        if field == "sliding_window" and value is not None and value >= config.get("max_position_embeddings", 0):
            continue  # a window as long as any sequence has no effect
        if field == "sliding_window" and config.get("use_sliding_window") is False:
            continue  # Qwen2/3 carry a window size they do not use
        if field == "layer_types" and value is not None and set(value) <= {"full_attention"}:
            continue
        if value not in allowed:
            raise ConversionError(f"config.json field {field} = {value!r} changes the model's math and has no "
                                  f"equivalent here (supported: {', '.join(repr(a) for a in allowed if a is not None)}"
                                  f"{'' if None not in allowed else ' or absent'}); not converted")


def common_flags(config: dict) -> list[str]:
    flags = [
        "--num-layers", str(config["num_hidden_layers"]), "--hidden-size", str(config["hidden_size"]),
        "--ffn-hidden-size", str(config["intermediate_size"]), "--num-attention-heads",
        str(config["num_attention_heads"]), "--vocab-size", str(config["vocab_size"]),
        "--max-position-embeddings", str(config["max_position_embeddings"]),
        "--seq-length", str(min(config["max_position_embeddings"], 4096)),
        "--norm-epsilon", repr(float(config.get("rms_norm_eps", 1e-6))), "--normalization", "RMSNorm",
        "--swiglu", "--disable-bias-linear", "--position-embedding-type", "rope",
    ]
    require(config.get("hidden_act", "silu") == "silu", f"config.json field hidden_act = {config.get('hidden_act')!r}: "
                                                        f"only silu (SwiGLU) is supported; not converted")
    check_representable(config)
    tied = config.get("tie_word_embeddings", False)
    flags.append("--no-untie-embeddings-and-output-weights" if tied else "--untie-embeddings-and-output-weights")
    return flags


def rotary_base_flags(theta) -> list[str]:
    return ["--rotary-base", str(int(theta)) if float(theta).is_integer() else str(theta)]


def llama_like_flags(config: dict) -> list[str]:
    """A Llama-layout decoder (GQA, SwiGLU, RMSNorm, RoPE with optional Llama-3.x scaling)."""
    heads, hidden = config["num_attention_heads"], config["hidden_size"]
    head_dim = config.get("head_dim") or hidden // heads
    theta, scaling = rope(config)
    flags = common_flags(config) + rotary_base_flags(theta)
    if scaling is not None:
        require(scaling["rope_type"] == "llama3", f"config.json field rope_scaling (rope_type "
                                                  f"{scaling['rope_type']!r}) is not supported for this family "
                                                  f"(only llama3); not converted")
        flags += ["--use-rope-scaling", "--rope-scaling-factor", repr(float(scaling["factor"]))]
        for field, dest in LLAMA3_ROPE_FLAGS.items():
            value = scaling.get(field, LLAMA3_SCALING_DEFAULTS[dest])
            value = int(value) if field == "original_max_position_embeddings" else float(value)
            flags += ["--" + dest.replace("_", "-"), repr(value)]
    groups = config.get("num_key_value_heads") or heads
    return flags + ["--group-query-attention", "--num-query-groups", str(groups), "--kv-channels", str(head_dim)]


def moe_flags(config: dict, experts: int, ffn: int) -> list[str]:
    return ["--num-experts", str(experts), "--moe-router-topk", str(config["num_experts_per_tok"]),
            "--moe-ffn-hidden-size", str(ffn)]


# ---- flags -> HF config.json ----------------------------------------------------------------------------------
def hf_config_base(family: Family, config, build) -> dict:
    """The config.json fields every decoder family writes (its own are added by the family), from megatron-core's
    TransformerConfig (the shape) and models/section.py's ModelBuild (vocabulary, tied embeddings, RoPE)."""
    out = {
        "architectures": [family.hf_architecture], "model_type": family.hf_model_type, "hidden_act": "silu",
        "num_hidden_layers": config.num_layers, "hidden_size": config.hidden_size,
        "intermediate_size": config.ffn_hidden_size, "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": config.num_query_groups, "vocab_size": build.vocab_size,
        "max_position_embeddings": build.max_position_embeddings, "rms_norm_eps": config.layernorm_epsilon,
        "tie_word_embeddings": not build.untie_embeddings_and_output_weights, "torch_dtype": "float32",
        "rope_theta": float(build.rotary_base), "attention_bias": False,
    }
    if not config.multi_latent_attention:  # DeepSeek's head_dim is its RoPE dim (set from the MLA fields)
        out["head_dim"] = config.kv_channels or config.hidden_size // config.num_attention_heads
    if build.use_rope_scaling:
        out["rope_scaling"] = {"rope_type": "llama3", "factor": build.rope_scaling_factor,
                               **{field: getattr(build, dest) for field, dest in LLAMA3_ROPE_FLAGS.items()}}
    return out


def llama_hf_config(config, build) -> dict:
    """Llama's config.json: ``--model llama3``'s, and LLaVA's ``text_config``."""
    return hf_config_base(Family(name="llama", presets={}, **LLAMA_HF), config, build)


# ---- the HF map ------------------------------------------------------------------------------------------------
def qkv_to_mcore(q, k, v, heads: int, groups: int) -> torch.Tensor:
    """Weights (rows x hidden) or biases (rows) of q/k/v -> megatron's per-group row order."""
    head_dim, rest = q.shape[0] // heads, q.shape[1:]
    q = q.view(groups, heads // groups, head_dim, *rest)
    k, v = k.view(groups, 1, head_dim, *rest), v.view(groups, 1, head_dim, *rest)
    return torch.cat([q, k, v], dim=1).reshape(-1, *rest)


def qkv_to_hf(qkv, heads: int, groups: int):
    per_group = heads // groups + 2
    rest = qkv.shape[1:]
    head_dim = qkv.shape[0] // (groups * per_group)
    grouped = qkv.view(groups, per_group, head_dim, *rest)
    q = grouped[:, : heads // groups].reshape(-1, *rest)
    return q, grouped[:, -2].reshape(-1, *rest), grouped[:, -1].reshape(-1, *rest)


def same(mcore: str, hf: str) -> Entry:
    return Entry(mcore, (hf,), lambda tensor: tensor, lambda tensor: (tensor,))


def _fused(gate, up):
    return torch.cat([gate, up])


_fused.concatenates_rows = True  # a chunk that is exactly one input's rows is that input (convert/streaming.py)


def gate_up(mcore: str, gate: str, up: str) -> Entry:
    return Entry(mcore, (gate, up), _fused, lambda tensor: torch.chunk(tensor, 2, dim=0))


def qkv(mcore: str, hf_prefix: str, part: str, heads: int, groups: int) -> Entry:
    return Entry(mcore, tuple(f"{hf_prefix}{x}_proj.{part}" for x in "qkv"),
                 lambda q, k, v: qkv_to_mcore(q, k, v, heads, groups), lambda t: qkv_to_hf(t, heads, groups))


def gqa_attention(config, mc: str, hp: str) -> list[Entry]:
    """Plain attention: fused q/k/v (+ Qwen2's biases), the output projection, Qwen3's q/k norms."""
    parts = ["weight", "bias"] if config.add_qkv_bias else ["weight"]
    out = [qkv(f"{mc}self_attention.linear_qkv.{p}", f"{hp}self_attn.", p, config.num_attention_heads,
               config.num_query_groups) for p in parts]
    out.append(same(mc + "self_attention.linear_proj.weight", hp + "self_attn.o_proj.weight"))
    if config.qk_layernorm:
        out += [same(mc + "self_attention.q_layernorm.weight", hp + "self_attn.q_norm.weight"),
                same(mc + "self_attention.k_layernorm.weight", hp + "self_attn.k_norm.weight")]
    return out


def decoder_map(config, build, attention=gqa_attention, moe_prefix: str = "mlp",
                mlp_names: tuple = ("gate_proj", "up_proj", "down_proj"), **_) -> list[Entry]:
    """The HF ``*ForCausalLM`` decoder: embedding, decoder (then MTP transformer) layers, final norm, head.
    ``attention(config, mcore layer prefix, hf layer prefix)`` gives a layer's attention entries; MoE layers name
    their experts and router under ``moe_prefix`` (Mixtral: ``block_sparse_moe``)."""
    out = [same("embedding.word_embeddings.weight", "model.embed_tokens.weight"),
           same("decoder.final_layernorm.weight", "model.norm.weight")]
    if build.untie_embeddings_and_output_weights:
        out.append(same("output_layer.weight", "lm_head.weight"))
    pattern = moe_layer_pattern(config.num_layers, config.num_moe_experts, config.moe_layer_freq)
    layers = [(f"decoder.layers.{i}.", f"model.layers.{i}.", bool(kind)) for i, kind in enumerate(pattern)]
    layers += [(f"mtp.layers.{k}.transformer_layer.", f"model.layers.{config.num_layers + k}.", bool(pattern[-1]))
               for k in range(config.mtp_num_layers or 0)]
    gate, up, down = mlp_names
    for mc, hp, is_moe in layers:
        out += [same(mc + "input_layernorm.weight", hp + "input_layernorm.weight"),
                same(mc + "pre_mlp_layernorm.weight", hp + "post_attention_layernorm.weight")]
        out += attention(config, mc, hp)
        mlps = [("mlp.", "mlp.")]
        if is_moe:
            mlps = [(f"mlp.experts.local_experts.{e}.", f"{moe_prefix}.experts.{e}.") for e in range(config.num_moe_experts)]
            if config.moe_shared_expert_intermediate_size:
                mlps.append(("mlp.shared_experts.", "mlp.shared_experts."))
        for m, h in mlps:
            out += [gate_up(f"{mc}{m}linear_fc1.weight", f"{hp}{h}{gate}.weight", f"{hp}{h}{up}.weight"),
                    same(f"{mc}{m}linear_fc2.weight", f"{hp}{h}{down}.weight")]
        if is_moe:
            out.append(same(mc + "mlp.router.weight", f"{hp}{moe_prefix}.gate.weight"))
            if config.moe_router_enable_expert_bias:
                out.append(same(mc + "mlp.router.expert_bias", f"{hp}{moe_prefix}.gate.e_score_correction_bias"))
    return out


FAMILY = Family(name="gpt", presets={})
