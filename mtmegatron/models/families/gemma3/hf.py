"""Gemma 3 text's HF ``config.json`` both ways and its tensor map (``Gemma3ForCausalLM``, model_type ``gemma3_text``).

Config facts (transformers 5.25 ``Gemma3TextConfig``): ``layer_types`` (else ``sliding_window_pattern``, default 6:
layer i slides unless (i + 1) % 6 == 0) -> ``--window-attn-skip-freq`` (the int where it is that pattern, else
the 0/1 list); HF's window of W keys (the query's own included) is megatron's ``(W - 1, 0)``; RoPE as
``rope_parameters`` per layer type (transformers 5) or ``rope_theta`` / ``rope_local_base_freq`` / ``rope_scaling``
(older files): the sliding layers' plain RoPE, the global layers' plain or linear (``--rotary-seq-len-interpolation-
factor``, an integer factor); ``query_pre_attn_scalar`` (HF default 256), ``head_dim`` (HF default 256),
``hidden_activation`` ``gelu_pytorch_tanh``. Refused by name: logit soft-capping (final or attention), bidirectional
attention, attention biases, another activation, other RoPE types or a non-integer linear factor.
Map facts: HF's ``(1 + w)`` norms store ``w`` as our ``--apply-layernorm-1p`` norms do (same tensors);
``post_attention_layernorm`` -> ``self_attention.post_layernorm``, ``pre_feedforward_layernorm`` ->
``pre_mlp_layernorm``, ``post_feedforward_layernorm`` -> ``mlp.post_layernorm`` (model.py), the rest is the plain
decoder's (gpt.py: fused q/k/v per query group, q/k norms, fused gate/up).
May assume: plain dicts for config.json; megatron-core's TransformerConfig and models/section.py's ModelBuild of the
same network.
"""

from __future__ import annotations

from mtmegatron.models.families import gpt
from mtmegatron.models.families.base import ConversionError, Family

_ACTIVATION = "gelu_pytorch_tanh"
# fields whose value changes the math, with the only value we reproduce (absent = that value)
_MUST_BE = {"final_logit_softcapping": None, "attn_logit_softcapping": None, "use_bidirectional_attention": False,
            "attention_bias": False}


def _refuse(field: str, value, why: str):
    raise ConversionError(f"config.json field {field} = {value!r} {why}; not converted")


def _number(value):
    return int(value) if float(value).is_integer() else float(value)


def rope(config: dict) -> tuple[float, int | None, float]:
    """(global theta, its linear scaling factor or None, local theta) from either config.json layout."""
    params = config.get("rope_parameters") or {}
    if "full_attention" in params or "sliding_attention" in params:
        full, local = dict(params.get("full_attention") or {}), dict(params.get("sliding_attention") or {})
    else:  # older files: one theta, the local base, rope_scaling for the global layers
        full = {**(config.get("rope_scaling") or {}), "rope_theta": config.get("rope_theta", 1_000_000.0)}
        local = {"rope_type": "default", "rope_theta": config.get("rope_local_base_freq", 10_000.0)}
    full.setdefault("rope_theta", 1_000_000.0)
    local.setdefault("rope_theta", 10_000.0)
    kind = full.get("rope_type") or full.get("type") or "default"
    local_kind = local.get("rope_type") or local.get("type") or "default"
    if local_kind != "default":
        _refuse("rope_parameters.sliding_attention.rope_type", local_kind, "is not supported (only default)")
    factor = None
    if kind == "linear":
        factor = full.get("factor", 1.0)
        if not float(factor).is_integer() or factor < 1:
            _refuse("rope_parameters.full_attention.factor", factor, "is not a whole number (megatron-core's "
                    "--rotary-seq-len-interpolation-factor is an integer)")
        factor = int(factor) if factor != 1 else None
    elif kind != "default":
        _refuse("rope_parameters.full_attention.rope_type", kind, "is not supported (only default or linear)")
    return full["rope_theta"], factor, local["rope_theta"]


def layer_types(config: dict) -> list[str]:
    types = config.get("layer_types")
    if types is None:
        pattern = config.get("sliding_window_pattern", config.get("_sliding_window_pattern", 6))
        types = ["sliding_attention" if (i + 1) % pattern else "full_attention"
                 for i in range(config["num_hidden_layers"])]
    unknown = set(types) - {"sliding_attention", "full_attention"}
    if unknown or len(types) != config["num_hidden_layers"]:
        _refuse("layer_types", types, "is not one sliding_attention/full_attention entry per layer")
    return list(types)


def skip_freq(types: list[str]) -> str:
    """``--window-attn-skip-freq``: N where layer i slides exactly when (i + 1) % N != 0, else the 0/1 list."""
    window = [int(t == "sliding_attention") for t in types]
    for n in range(2, len(window) + 1):
        if window == [int((i + 1) % n != 0) for i in range(len(window))]:
            return str(n)
    return "[" + ",".join(map(str, window)) + "]"


def flags_from_hf(config: dict) -> list[str]:
    for field, value in _MUST_BE.items():
        if config.get(field) not in (None, value):
            _refuse(field, config[field], f"has no equivalent here (supported: {value!r} or absent)")
    activation = config.get("hidden_activation", config.get("hidden_act", _ACTIVATION))
    if activation != _ACTIVATION:
        _refuse("hidden_activation", activation, f"is not supported (only {_ACTIVATION}, GeGLU with tanh GeLU)")
    theta, factor, local_theta = rope(config)
    types = layer_types(config)
    window = config.get("sliding_window")
    if "sliding_attention" in types and (window is None or window < 1):
        _refuse("sliding_window", window, "must be a positive size where layers slide")
    positions = config["max_position_embeddings"]
    flags = [
        "--num-layers", str(config["num_hidden_layers"]), "--hidden-size", str(config["hidden_size"]),
        "--ffn-hidden-size", str(config["intermediate_size"]), "--num-attention-heads",
        str(config["num_attention_heads"]), "--vocab-size", str(config["vocab_size"]),
        "--max-position-embeddings", str(positions), "--seq-length", str(min(positions, 4096)),
        "--norm-epsilon", repr(float(config.get("rms_norm_eps", 1e-6))), "--normalization", "RMSNorm",
        "--apply-layernorm-1p", "--disable-bias-linear", "--position-embedding-type", "rope",
        *gpt.rotary_base_flags(theta), "--rotary-base-local", repr(float(local_theta)),
        "--group-query-attention", "--num-query-groups",
        str(config.get("num_key_value_heads") or config["num_attention_heads"]),
        "--kv-channels", str(config.get("head_dim", 256)), "--qk-layernorm",
        "--query-pre-attn-scalar", repr(float(config.get("query_pre_attn_scalar", 256))),
        "--window-size", f"{(window or 1) - 1},0", "--window-attn-skip-freq", skip_freq(types),
        "--no-untie-embeddings-and-output-weights" if config.get("tie_word_embeddings", True)
        else "--untie-embeddings-and-output-weights",
    ]
    if factor is not None:
        flags += ["--rotary-seq-len-interpolation-factor", str(factor)]
    return flags


def _layer_types(config) -> list[str]:
    """megatron-core's is_layer_window_attention for each layer, as HF's layer_types."""
    freq = config.window_attn_skip_freq

    def slides(number: int) -> bool:
        if not config.window_size:
            return False
        if freq is None:
            return True
        return bool(freq[number - 1]) if isinstance(freq, list) else number % freq != 0

    return ["sliding_attention" if slides(i + 1) else "full_attention" for i in range(config.num_layers)]


def hf_config(family: Family, config, build) -> dict:
    full = {"rope_type": "default", "rope_theta": float(build.rotary_base)}
    if build.rotary_seq_len_interpolation_factor:
        full = {"rope_type": "linear", "factor": float(build.rotary_seq_len_interpolation_factor),
                "rope_theta": float(build.rotary_base)}
    window = config.window_size[0] + 1 if config.window_size else None
    return {
        "architectures": [family.hf_architecture], "model_type": family.hf_model_type,
        "hidden_activation": _ACTIVATION, "num_hidden_layers": config.num_layers, "hidden_size": config.hidden_size,
        "intermediate_size": config.ffn_hidden_size, "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": config.num_query_groups, "head_dim": config.kv_channels, "vocab_size": build.vocab_size,
        "max_position_embeddings": build.max_position_embeddings, "rms_norm_eps": config.layernorm_epsilon,
        "tie_word_embeddings": not build.untie_embeddings_and_output_weights, "torch_dtype": "float32",
        "attention_bias": False, "query_pre_attn_scalar": _number(build.query_pre_attn_scalar or config.kv_channels),
        "sliding_window": window, "layer_types": _layer_types(config),
        "rope_parameters": {"sliding_attention": {"rope_type": "default",
                                                  "rope_theta": float(build.rotary_base_local or 10_000.0)},
                            "full_attention": full},
        "final_logit_softcapping": None, "attn_logit_softcapping": None, "use_bidirectional_attention": False,
    }


def hf_map(config, build, **_) -> list:
    """The plain decoder's map (gpt.decoder_map) with Gemma 3's two extra norms per layer and its pre-MLP norm's
    name."""
    out = []
    for entry in gpt.decoder_map(config, build):
        if entry.mcore.endswith("pre_mlp_layernorm.weight"):
            layer = entry.mcore[: -len("pre_mlp_layernorm.weight")]
            hf_layer = entry.hf[0][: -len("post_attention_layernorm.weight")]
            out += [gpt.same(entry.mcore, hf_layer + "pre_feedforward_layernorm.weight"),
                    gpt.same(layer + "self_attention.post_layernorm.weight",
                             hf_layer + "post_attention_layernorm.weight"),
                    gpt.same(layer + "mlp.post_layernorm.weight", hf_layer + "post_feedforward_layernorm.weight")]
        else:
            out.append(entry)
    return out
