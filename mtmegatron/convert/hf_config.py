"""HF ``config.json`` <-> mtmegatron pretrain flags, per model family, refusing what we cannot represent.

``flags_from_hf(family, config)`` gives the Megatron-LM flags that build the same network, every model value
explicit so no preset value leaks in (a ConversionError names the first config field that changes the math and
has no equivalent: ``check_representable``); ``hf_config_from_args(family, args)`` gives a config.json
for the way back. Facts used: Llama/Mixtral/Mistral/Qwen have no
biases except Qwen2's on q/k/v (``--add-qkv-bias``); a head_dim other than hidden/heads is ``--kv-channels``;
Llama-3.x ``rope_scaling`` (type ``llama3``) is megatron-core's ``--use-rope-scaling`` with the config's own
frequency factors and original context (``--rope-scaling-low/high-freq-factor``,
``--rope-scaling-original-max-position-embeddings``; patches/llama3_rope_scaling_values.py); Qwen3 normalises each head's q and k (``--qk-layernorm``); Qwen3-MoE's softmax router with
``norm_topk_prob`` is megatron's default softmax router (top-k of the logits, softmax over those); DeepSeek-V3's router
scores a group by its top-2 experts (megatron: top topk/group_topk), normalises the top-k weights (megatron's
sigmoid router always does), and its RoPE dims are interleaved pairs (rope_interleave, undone in mapping.py).
LLaVA's config (a CLIP tower around a Llama text config) is handled in convert/llava.py with ``_llama_like``.
May assume: plain dicts (config.json as loaded).
"""

from __future__ import annotations

FAMILIES = {"llama": "llama3", "mixtral": "mixtral", "deepseek_v3": "deepseek-v3", "llava": "llava",
            "qwen2": "qwen2.5", "qwen3": "qwen3", "qwen3_moe": "qwen3-moe", "mistral": "mistral"}
HF_ARCH = {"llama3": "LlamaForCausalLM", "mixtral": "MixtralForCausalLM", "deepseek-v3": "DeepseekV3ForCausalLM",
           "llava": "LlavaForConditionalGeneration", "qwen2.5": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
           "qwen3-moe": "Qwen3MoeForCausalLM", "mistral": "MistralForCausalLM"}
# Llama-3.x rope_scaling fields -> their flags (defaults: megatron-core's RotaryEmbedding._apply_scaling's)
LLAMA3_ROPE_FLAGS = {"low_freq_factor": "rope_scaling_low_freq_factor", "high_freq_factor":
                     "rope_scaling_high_freq_factor",
                     "original_max_position_embeddings": "rope_scaling_original_max_position_embeddings"}
HF_TYPE = {v: k for k, v in FAMILIES.items()}


class ConversionError(ValueError):
    """A checkpoint or config that cannot be converted as asked; the message says why."""


def family_of(config: dict, requested: str) -> str:
    model_type = config.get("model_type")
    family = FAMILIES.get(model_type)
    if family is None:
        raise ConversionError(f"HF model_type {model_type!r} is not supported (supported: {', '.join(FAMILIES)})")
    if family != requested:
        raise ConversionError(f"--model {requested} does not match the checkpoint's model_type {model_type!r} "
                              f"(use --model {family})")
    return family


def _rope(config: dict) -> tuple[float, dict | None]:
    """(rope theta, scaling dict or None) from either transformers-5 ``rope_parameters`` or the older keys."""
    params = dict(config.get("rope_parameters") or {})
    scaling = dict(config.get("rope_scaling") or {})
    theta = params.get("rope_theta", config.get("rope_theta", 10000.0))
    kind = params.get("rope_type") or scaling.get("rope_type") or scaling.get("type") or "default"
    if kind == "default":
        return theta, None
    merged = {**scaling, **params, "rope_type": kind}
    return theta, merged


def _require(condition: bool, message: str) -> None:
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


def _common(config: dict) -> list[str]:
    heads = config["num_attention_heads"]
    flags = [
        "--num-layers", str(config["num_hidden_layers"]), "--hidden-size", str(config["hidden_size"]),
        "--ffn-hidden-size", str(config["intermediate_size"]), "--num-attention-heads", str(heads),
        "--vocab-size", str(config["vocab_size"]),
        "--max-position-embeddings", str(config["max_position_embeddings"]),
        "--seq-length", str(min(config["max_position_embeddings"], 4096)),
        "--norm-epsilon", repr(float(config.get("rms_norm_eps", 1e-6))), "--normalization", "RMSNorm",
        "--swiglu", "--disable-bias-linear", "--position-embedding-type", "rope",
    ]
    _require(config.get("hidden_act", "silu") == "silu", f"config.json field hidden_act = {config.get('hidden_act')!r}: "
                                                          f"only silu (SwiGLU) is supported; not converted")
    check_representable(config)
    # every model-defining value explicit, so no preset value leaks into the converted network
    tied = config.get("tie_word_embeddings", False)
    flags.append("--no-untie-embeddings-and-output-weights" if tied else "--untie-embeddings-and-output-weights")
    return flags


def _llama3_rope_scaling(scaling: dict) -> list[str]:
    """megatron-core's Llama-3.x scaling with the config's own factors and original context (absent: HF's and
    megatron-core's Llama-3.1 values)."""
    from mtmegatron.models.family_args import LLAMA3_SCALING_DEFAULTS

    flags = ["--use-rope-scaling", "--rope-scaling-factor", repr(float(scaling["factor"]))]
    for field, dest in LLAMA3_ROPE_FLAGS.items():
        value = scaling.get(field, LLAMA3_SCALING_DEFAULTS[dest])
        value = int(value) if field == "original_max_position_embeddings" else float(value)
        flags += ["--" + dest.replace("_", "-"), repr(value)]
    return flags


def _llama_like(config: dict) -> list[str]:
    heads, hidden = config["num_attention_heads"], config["hidden_size"]
    head_dim = config.get("head_dim") or hidden // heads
    theta, scaling = _rope(config)
    flags = _common(config) + ["--rotary-base", str(int(theta)) if float(theta).is_integer() else str(theta)]
    if scaling is not None:
        _require(scaling["rope_type"] == "llama3", f"config.json field rope_scaling (rope_type "
                                                   f"{scaling['rope_type']!r}) is not supported for this family "
                                                   f"(only llama3); not converted")
        flags += _llama3_rope_scaling(scaling)
    groups = config.get("num_key_value_heads") or heads
    return flags + ["--group-query-attention", "--num-query-groups", str(groups), "--kv-channels", str(head_dim)]


def _qwen(family: str, config: dict) -> list[str]:
    flags = _llama_like(config)
    if family == "qwen2.5":  # Qwen2 always has q/k/v biases (no attention_bias field)
        return flags + ["--add-qkv-bias"]
    flags.append("--qk-layernorm")
    if family == "qwen3-moe":
        _require(config.get("norm_topk_prob", False),
                 "config.json field norm_topk_prob = false: megatron's softmax router normalises the top-k "
                 "weights; not converted")
        experts = config.get("num_experts") or config["num_local_experts"]  # transformers 5 renamed it
        flags += ["--num-experts", str(experts), "--moe-router-topk", str(config["num_experts_per_tok"]),
                  "--moe-ffn-hidden-size", str(config["moe_intermediate_size"]),
                  "--moe-router-score-function", "softmax",
                  "--moe-aux-loss-coeff", repr(float(config.get("router_aux_loss_coef", 0.0)))]
    return flags


def _mixtral(config: dict) -> list[str]:
    return _llama_like(config) + [
        "--num-experts", str(config["num_local_experts"]), "--moe-router-topk", str(config["num_experts_per_tok"]),
        "--moe-ffn-hidden-size", str(config["intermediate_size"]),
        "--moe-aux-loss-coeff", repr(float(config.get("router_aux_loss_coef", 0.0))),
    ]


def _deepseek_v3(config: dict, with_mtp: bool) -> list[str]:
    _require(config.get("scoring_func", "sigmoid") == "sigmoid", "only the sigmoid router (scoring_func) is supported")
    topk, groups, group_topk = config["num_experts_per_tok"], config.get("n_group") or 1, config.get("topk_group") or 1
    _require(config.get("norm_topk_prob", True) or topk == 1,
             "norm_topk_prob false: megatron's sigmoid router always normalises the top-k weights")
    layers, first_dense = config["num_hidden_layers"], config.get("first_k_dense_replace", 0)
    freq = f"([0]*{first_dense}+[1]*{layers - first_dense})"
    flags = _common(config) + [
        "--multi-latent-attention", "--qk-layernorm", "--kv-lora-rank", str(config["kv_lora_rank"]),
        "--qk-head-dim", str(config["qk_nope_head_dim"]), "--qk-pos-emb-head-dim", str(config["qk_rope_head_dim"]),
        "--v-head-dim", str(config["v_head_dim"]), "--moe-layer-freq", freq,
        "--num-experts", str(config["n_routed_experts"]), "--moe-router-topk", str(topk),
        "--moe-ffn-hidden-size", str(config["moe_intermediate_size"]),
        "--moe-router-score-function", "sigmoid", "--moe-router-enable-expert-bias",
        "--moe-router-topk-scaling-factor", repr(float(config.get("routed_scaling_factor", 1.0))),
    ]
    # every size explicit (0 = off) so no preset value leaks into the converted network
    flags += ["--q-lora-rank", str(config.get("q_lora_rank") or 0), "--moe-shared-expert-intermediate-size",
              str((config.get("n_shared_experts") or 0) * config["moe_intermediate_size"])]
    if groups == 1:
        flags += ["--moe-router-num-groups", "0", "--moe-router-group-topk", "0"]
    else:
        _require(topk % group_topk == 0 and topk // group_topk == 2,
                 f"group-limited routing: HF scores a group by its top-2 experts, megatron by its top "
                 f"num_experts_per_tok/topk_group = {topk}/{group_topk}; these differ")
        flags += ["--moe-router-num-groups", str(groups), "--moe-router-group-topk", str(group_topk)]
    theta, scaling = _rope(config)
    flags += ["--rotary-base", str(int(theta)) if float(theta).is_integer() else str(theta)]
    if scaling is None:  # megatron's MLA takes its softmax scale from the YaRN fields even for plain RoPE
        flags += ["--rope-type", "rope", "--rotary-scaling-factor", "1.0", "--mscale", "1.0", "--mscale-all-dim", "0.0"]
    else:
        _require(scaling["rope_type"] == "yarn", f"RoPE scaling {scaling['rope_type']!r}: only yarn is supported")
        flags += ["--rope-type", "yarn", "--rotary-scaling-factor", repr(float(scaling["factor"])),
                  "--original-max-position-embeddings", str(scaling["original_max_position_embeddings"]),
                  "--beta-fast", repr(float(scaling.get("beta_fast", 32))),
                  "--beta-slow", repr(float(scaling.get("beta_slow", 1))),
                  "--mscale", repr(float(scaling.get("mscale", 1.0))),
                  "--mscale-all-dim", repr(float(scaling.get("mscale_all_dim", 0.0)))]
    flags += ["--mtp-num-layers", str(config.get("num_nextn_predict_layers") or 0 if with_mtp else 0)]
    return flags


def flags_from_hf(family: str, config: dict, with_mtp: bool = True) -> list[str]:
    """Pretrain flags (model part) that build the network ``config`` describes."""
    if family == "llama3":
        return ["--model", family] + _llama_like(config)
    if family == "mixtral":
        return ["--model", family] + _mixtral(config)
    if family == "mistral":
        return ["--model", family] + _llama_like(config)
    if family in ("qwen2.5", "qwen3", "qwen3-moe"):
        return ["--model", family] + _qwen(family, config)
    return ["--model", family] + _deepseek_v3(config, with_mtp)


def hf_config_from_args(family: str, args, rope_interleave: bool = True) -> dict:
    """config.json for the HF model equal to the megatron model built from ``args``."""
    config = {
        "architectures": [HF_ARCH[family]], "model_type": HF_TYPE[family], "hidden_act": "silu",
        "num_hidden_layers": args.num_layers, "hidden_size": args.hidden_size,
        "intermediate_size": args.ffn_hidden_size, "num_attention_heads": args.num_attention_heads,
        "num_key_value_heads": args.num_query_groups, "vocab_size": args.vocab_size,
        "max_position_embeddings": args.max_position_embeddings, "rms_norm_eps": args.norm_epsilon,
        "tie_word_embeddings": not args.untie_embeddings_and_output_weights, "torch_dtype": "float32",
        "rope_theta": float(args.rotary_base), "attention_bias": False,
    }
    if family != "deepseek-v3":  # DeepSeek's head_dim is its RoPE dim (set below from the MLA fields)
        config["head_dim"] = args.kv_channels or args.hidden_size // args.num_attention_heads
    if args.use_rope_scaling:
        config["rope_scaling"] = {"rope_type": "llama3", "factor": args.rope_scaling_factor,
                                  **{field: getattr(args, dest) for field, dest in LLAMA3_ROPE_FLAGS.items()}}
    if family.startswith("qwen"):
        del config["attention_bias"]
        config.update(use_sliding_window=False, sliding_window=None)
    if family in ("qwen3", "qwen3-moe"):
        config["attention_bias"] = False
    if family == "mistral":
        config["sliding_window"] = None
    if family == "qwen3-moe":
        config.update(num_experts=args.num_experts, num_local_experts=args.num_experts, num_experts_per_tok=args.moe_router_topk,
                      moe_intermediate_size=args.moe_ffn_hidden_size, norm_topk_prob=True, decoder_sparse_step=1,
                      mlp_only_layers=[], router_aux_loss_coef=args.moe_aux_loss_coeff)
    if family == "mixtral":
        config.update(num_local_experts=args.num_experts, num_experts_per_tok=args.moe_router_topk,
                      router_aux_loss_coef=args.moe_aux_loss_coeff)
    if family == "deepseek-v3":
        pattern = args.moe_layer_freq if isinstance(args.moe_layer_freq, list) else None
        first_dense = pattern.index(1) if pattern else 0
        config.update(
            num_key_value_heads=args.num_attention_heads, q_lora_rank=args.q_lora_rank,
            kv_lora_rank=args.kv_lora_rank, qk_nope_head_dim=args.qk_head_dim,
            qk_rope_head_dim=args.qk_pos_emb_head_dim, v_head_dim=args.v_head_dim,
            first_k_dense_replace=first_dense, n_routed_experts=args.num_experts,
            num_experts_per_tok=args.moe_router_topk, moe_intermediate_size=args.moe_ffn_hidden_size,
            n_shared_experts=(args.moe_shared_expert_intermediate_size or 0) // args.moe_ffn_hidden_size,
            n_group=args.moe_router_num_groups or 1, topk_group=args.moe_router_group_topk or 1,
            routed_scaling_factor=args.moe_router_topk_scaling_factor or 1.0, norm_topk_prob=True,
            scoring_func="sigmoid", topk_method="noaux_tc", num_nextn_predict_layers=args.mtp_num_layers or 0,
            rope_interleave=rope_interleave,
        )
        if args.rope_type == "yarn":
            config["rope_scaling"] = {
                "type": "yarn", "rope_type": "yarn", "factor": args.rotary_scaling_factor,
                "original_max_position_embeddings": args.original_max_position_embeddings,
                "beta_fast": args.beta_fast, "beta_slow": args.beta_slow, "mscale": args.mscale,
                "mscale_all_dim": args.mscale_all_dim,
            }
    return config
