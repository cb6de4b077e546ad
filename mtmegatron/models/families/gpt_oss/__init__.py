"""GPT-OSS (``--model gpt-oss``; HF ``GptOssForCausalLM``, model_type ``gpt_oss``): every layer MoE, attention
sinks, alternating sliding-window / full attention, YaRN RoPE, biases everywhere.

What each HF piece is here (megatron-core 0.16.1 fields, no module of our own):
- router ``mlp.router`` (weight + bias: ``add_bias_linear``), top-k of the logits then softmax over those k
  (megatron's softmax router with ``moe_router_pre_softmax`` off);
- experts: HF stores them stacked, ``gate_up_proj`` [E, hidden, 2I] with gate and up INTERLEAVED along the last
  dim (gate = columns 0::2, up = 1::2), ``down_proj`` [E, I, hidden] (transposed to torch's [out, in]), biases
  ``gate_up_proj_bias`` [E, 2I] (interleaved too) and ``down_proj_bias`` [E, hidden]; megatron's
  ``local_experts.<e>.linear_fc1`` is ``cat([gate rows, up rows])``. The way back stacks the E experts
  again (a multi-tensor group, convert/mapping.py);
- the clamped SwiGLU ``(clamp(up, -L, L) + 1) * g * sigmoid(1.702 g)`` with ``g = clamp(gate, max=L)`` is
  megatron's gated ``quick_gelu`` (its alpha is fixed at 1.702: another ``swiglu_alpha`` is refused) with
  ``glu_linear_offset`` 1 and ``activation_func_clamp_value`` L (the same clamps: gate above, up both sides);
- ``self_attn.sinks`` (one logit per head) -> ``core_attention.softmax_offset`` with ``--softmax-type
  learnable``; HF's window W keeps keys with ``q - k < W``: ``--window-size W-1,0``; ``layer_types`` ->
  ``--window-attn-skip-freq`` (2 for HF's default sliding/full alternation, else the per-layer list);
- YaRN (``rope_parameters``): ``--rope-type yarn`` and its fields on a plain (non-MLA) attention, built by
  ``rope.build_context`` (megatron-core's GPTModel 'yarn' path needs config fields TransformerConfig lacks and
  drops the attention factor); ``truncate: true`` (HF's default when absent: integer correction range) is
  refused, the release's ``false`` is what we build;
- q/k/v/o biases (``attention_bias`` must be true: ``add_bias_linear`` gives every linear one), GQA, head_dim 64
  independent of hidden/heads (``--kv-channels``), untied embeddings.
Released weights in MXFP4 (``quantization_config``) are refused by name: dequantise them first (HF's
``Mxfp4Config(dequantize=True)``, then save_pretrained).
Presets ``20b``/``120b``: the shapes of openai/gpt-oss-20b and -120b config.json as we remember them (not read
from the files here): 24/36 layers, hidden 2880, 64 heads of 64, 8 KV heads, 32/128 experts of 2880, top-4,
vocabulary 201088, window 128, YaRN factor 32 over 4096, theta 150000.
May assume: what gpt.py assumes.
"""

from __future__ import annotations

import torch

import mtmegatron.models.families.gpt as gpt
from mtmegatron.models.families.base import ConversionError, Entry, Family
from mtmegatron.models.families.gpt_oss.rope import build_context

QUICK_GELU_ALPHA = 1.702  # megatron-core's quick_gelu: x * sigmoid(1.702 x)
_COMMON = dict(
    normalization="RMSNorm", layernorm_epsilon=1e-5, swiglu=False, quick_geglu=True, glu_linear_offset=1.0,
    activation_func_clamp_value=7.0, add_bias_linear=True, position_embedding_type="rope",
    untie_embeddings_and_output_weights=True, group_query_attention=True, kv_channels=64,
    softmax_type="learnable", window_attn_skip_freq=2, rope_type="yarn", rotary_base=150000,
    rotary_scaling_factor=32.0, original_max_position_embeddings=4096, beta_fast=32.0, beta_slow=1.0, mscale=1.0,
    mscale_all_dim=0.0, moe_router_score_function="softmax", moe_token_dispatcher_type="alltoall",
    moe_router_load_balancing_type="aux_loss", moe_aux_loss_coeff=1e-3,
    expert_tensor_parallel_size=1,  # megatron-core: biases in MoE experts only with expert TP 1
)
_REAL = dict(hidden_size=2880, ffn_hidden_size=2880, moe_ffn_hidden_size=2880, num_attention_heads=64,
             num_query_groups=8, vocab_size=201088, seq_length=4096, max_position_embeddings=131072,
             window_size=(127, 0), moe_router_topk=4)

PRESETS = {
    # 4 layers (sliding, full, sliding, full), head dim 32 while hidden/heads is 16, window 8 of 128 positions
    "tiny": dict(_COMMON, num_layers=4, hidden_size=128, ffn_hidden_size=64, moe_ffn_hidden_size=64,
                 num_attention_heads=8, num_query_groups=4, kv_channels=32, seq_length=128,
                 max_position_embeddings=128, vocab_size=1024, window_size=(7, 0), num_experts=4,
                 moe_router_topk=2, rotary_base=10000, rotary_scaling_factor=4.0, original_max_position_embeddings=32),
    "20b": dict(_COMMON, **_REAL, num_layers=24, num_experts=32),
    "120b": dict(_COMMON, **_REAL, num_layers=36, num_experts=128),
}

_HF_ONLY_DEFAULTS = {"attention_dropout": (0.0, 0, None), "hidden_act": ("silu", None), "mlp_bias": (False, None),
                     "partial_rotary_factor": (1.0, None)}


def _layer_pattern(config: dict) -> list[int]:
    layers = config["num_hidden_layers"]
    types = config.get("layer_types") or ["sliding_attention" if (i + 1) % 2 else "full_attention"
                                          for i in range(layers)]
    gpt.require(len(types) == layers and set(types) <= {"sliding_attention", "full_attention"},
                f"config.json field layer_types = {types!r}: expected one of sliding_attention / full_attention "
                f"per layer; not converted")
    return [int(t == "sliding_attention") for t in types]


def _window_flags(config: dict) -> list[str]:
    pattern, window = _layer_pattern(config), config.get("sliding_window")
    if window is None or not any(pattern):
        return []
    gpt.require(window >= 1, f"config.json field sliding_window = {window!r}: must be positive; not converted")
    if all(pattern):
        skip = []
    elif pattern == [int(bool((i + 1) % 2)) for i in range(len(pattern))]:
        skip = ["--window-attn-skip-freq", "2"]  # megatron: layer_number % 2 != 0 is windowed (HF's default)
    else:
        skip = ["--window-attn-skip-freq", repr(pattern)]
    return ["--window-size", f"{window - 1},0"] + skip


def _yarn_flags(config: dict) -> list[str]:
    theta, scaling = gpt.rope(config)
    flags = gpt.rotary_base_flags(theta)
    if scaling is None:
        return flags
    gpt.require(scaling["rope_type"] == "yarn", f"config.json field rope_parameters.rope_type = "
                                                f"{scaling['rope_type']!r}: only yarn is supported; not converted")
    gpt.require(scaling.get("truncate", True) is False,
                f"config.json field rope_parameters.truncate = {scaling.get('truncate', True)!r} (absent means "
                f"true in HF): only false (the released models') is built here; not converted")
    gpt.require(scaling.get("attention_factor") is None,
                "config.json field rope_parameters.attention_factor: an explicit YaRN attention factor is not "
                "supported (it is derived from factor / mscale); not converted")
    factor = scaling.get("factor") or config["max_position_embeddings"] / scaling["original_max_position_embeddings"]
    mscale, mscale_all = scaling.get("mscale"), scaling.get("mscale_all_dim")
    both = bool(mscale and mscale_all)  # HF: the ratio only when both are set, else 0.1 ln(factor) + 1
    return flags + ["--rope-type", "yarn", "--rotary-scaling-factor", repr(float(factor)),
                    "--original-max-position-embeddings", str(int(scaling["original_max_position_embeddings"])),
                    "--beta-fast", repr(float(scaling.get("beta_fast") or 32)),
                    "--beta-slow", repr(float(scaling.get("beta_slow") or 1)),
                    "--mscale", repr(float(mscale) if both else 1.0),
                    "--mscale-all-dim", repr(float(mscale_all) if both else 0.0)]


def flags_from_hf(config: dict, **_) -> list[str]:
    if config.get("quantization_config"):
        method = (config["quantization_config"] or {}).get("quant_method")
        raise ConversionError(f"config.json field quantization_config (quant_method {method!r}): quantised weights "
                              f"are not converted; dequantise first (transformers' Mxfp4Config(dequantize=True), "
                              f"then save_pretrained)")
    for field, allowed in _HF_ONLY_DEFAULTS.items():
        gpt.require(config.get(field) in allowed, f"config.json field {field} = {config.get(field)!r} changes the "
                                                  f"model's math and has no equivalent here; not converted")
    gpt.require(config.get("attention_bias", True) is True,
                f"config.json field attention_bias = {config.get('attention_bias')!r}: GPT-OSS here has biases on "
                f"every linear (add_bias_linear); not converted")
    alpha = float(config.get("swiglu_alpha", QUICK_GELU_ALPHA))
    gpt.require(alpha == QUICK_GELU_ALPHA, f"config.json field swiglu_alpha = {alpha!r}: megatron-core's quick_gelu "
                                           f"fixes it at {QUICK_GELU_ALPHA}; not converted")
    heads = config["num_attention_heads"]
    experts = config.get("num_local_experts") or config["num_experts"]
    flags = [
        "--model", FAMILY.name, "--num-layers", str(config["num_hidden_layers"]),
        "--hidden-size", str(config["hidden_size"]), "--ffn-hidden-size", str(config["intermediate_size"]),
        "--num-attention-heads", str(heads), "--vocab-size", str(config["vocab_size"]),
        "--max-position-embeddings", str(config["max_position_embeddings"]),
        "--seq-length", str(min(config["max_position_embeddings"], 4096)),
        "--norm-epsilon", repr(float(config.get("rms_norm_eps", 1e-5))), "--normalization", "RMSNorm",
        "--quick-geglu", "--glu-linear-offset", "1.0",
        "--activation-func-clamp-value", repr(float(config.get("swiglu_limit", 7.0))),
        "--position-embedding-type", "rope", "--softmax-type", "learnable",
        "--group-query-attention", "--num-query-groups", str(config.get("num_key_value_heads") or heads),
        "--kv-channels", str(config.get("head_dim") or config["hidden_size"] // heads),
        "--no-untie-embeddings-and-output-weights" if config.get("tie_word_embeddings", False)
        else "--untie-embeddings-and-output-weights",
    ]
    flags += _window_flags(config) + _yarn_flags(config)
    return flags + gpt.moe_flags(config, experts, config["intermediate_size"]) + [
        "--moe-router-score-function", "softmax",
        "--moe-aux-loss-coeff", repr(float(config.get("router_aux_loss_coef", 0.0)))]


def hf_config(config, build, **_) -> dict:
    out = gpt.hf_config_base(FAMILY, config, build)
    del out["rope_theta"]
    layers, window = config.num_layers, config.window_size
    from megatron.core.transformer.utils import is_layer_window_attention

    sliding = [bool(window) and is_layer_window_attention(window, config.window_attn_skip_freq, i + 1)
               for i in range(layers)]
    rope = {"rope_type": "default", "rope_theta": float(build.rotary_base)}
    if build.rope_type == "yarn":
        rope.update(rope_type="yarn", factor=build.rotary_scaling_factor, beta_fast=build.beta_fast,
                    beta_slow=build.beta_slow, truncate=False,
                    original_max_position_embeddings=build.original_max_position_embeddings)
        if build.mscale_all_dim:
            rope.update(mscale=build.mscale, mscale_all_dim=build.mscale_all_dim)
    out.update(
        intermediate_size=config.moe_ffn_hidden_size, num_local_experts=config.num_moe_experts,
        num_experts_per_tok=config.moe_router_topk, router_aux_loss_coef=config.moe_aux_loss_coeff,
        attention_bias=True, swiglu_limit=config.activation_func_clamp_value, swiglu_alpha=QUICK_GELU_ALPHA,
        sliding_window=window[0] + 1 if window else None,
        layer_types=["sliding_attention" if s else "full_attention" for s in sliding], rope_parameters=rope,
    )
    return out


def check_config(config) -> None:
    """What the map and the model need of a model converted back to HF (a ConversionError otherwise); megatron-core's
    config carries ``--quick-geglu`` as a gated quick-GeLU (models/config_from_flags.py)."""
    from megatron.core.fusions.fused_bias_geglu import quick_gelu

    quick_geglu = config.gated_linear_unit and config.activation_func is quick_gelu
    for ok, what in ((config.num_moe_experts, "--num-experts"), (config.add_bias_linear, "biases (add_bias_linear)"),
                     (quick_geglu and config.glu_linear_offset == 1.0, "--quick-geglu --glu-linear-offset 1"),
                     (config.softmax_type == "learnable", "--softmax-type learnable")):
        if not ok:
            raise ConversionError(f"GPT-OSS needs {what}")


# ---- the HF map -------------------------------------------------------------------------------------------------
def _fc1_rows(stacked: torch.Tensor, e: int) -> torch.Tensor:
    """HF [E, hidden, 2I] (or bias [E, 2I]) interleaved gate/up -> expert e's [2I, hidden] (or [2I]) as
    cat([gate, up])."""
    t = stacked[e].transpose(0, 1) if stacked.dim() == 3 else stacked[e]
    return torch.cat([t[0::2], t[1::2]]).contiguous()


def _fc1_stack(*experts: torch.Tensor) -> torch.Tensor:
    out = []
    for t in experts:
        gate, up = torch.chunk(t, 2, dim=0)
        inter = torch.stack([gate, up], dim=1).reshape(t.shape)  # rows g0, u0, g1, u1, ...
        out.append(inter.transpose(0, 1) if t.dim() == 2 else inter)
    return torch.stack(out).contiguous()


def _fc2_of(stacked: torch.Tensor, e: int) -> torch.Tensor:
    """Expert e's own copy (a view's storage offset would be lost: convert/streaming.py reads chunks with
    as_strided from the start of the storage)."""
    t = stacked[e].transpose(0, 1) if stacked.dim() == 3 else stacked[e]
    return t.clone(memory_format=torch.contiguous_format)


def _fc2_stack(*experts: torch.Tensor) -> torch.Tensor:
    return torch.stack([t.transpose(0, 1) if t.dim() == 2 else t for t in experts]).contiguous()


def _experts(config, mc: str, hp: str) -> list[Entry]:
    out = []
    experts = range(config.num_moe_experts)
    for part, hf_suffix in (("weight", ""), ("bias", "_bias")):
        for layer, name, split, stack in (("linear_fc1", "gate_up_proj", _fc1_rows, _fc1_stack),
                                          ("linear_fc2", "down_proj", _fc2_of, _fc2_stack)):
            hf = f"{hp}mlp.experts.{name}{hf_suffix}"
            names = tuple(f"{mc}mlp.experts.local_experts.{e}.{layer}.{part}" for e in experts)
            out += [Entry(n, (hf,), lambda t, e=e, split=split: split(t, e), None) for e, n in enumerate(names)]
            out.append(Entry(names, (hf,), None, lambda *ts, stack=stack: (stack(*ts),)))
    return out


def _attention(config, mc: str, hp: str) -> list[Entry]:
    out = [gpt.qkv(f"{mc}self_attention.linear_qkv.{p}", f"{hp}self_attn.", p, config.num_attention_heads,
                   config.num_query_groups) for p in ("weight", "bias")]
    out += [gpt.same(f"{mc}self_attention.linear_proj.{p}", f"{hp}self_attn.o_proj.{p}") for p in ("weight", "bias")]
    return out + [gpt.same(f"{mc}self_attention.core_attention.softmax_offset", f"{hp}self_attn.sinks")]


def hf_map(config, build, **_) -> list[Entry]:
    check_config(config)
    out = [gpt.same("embedding.word_embeddings.weight", "model.embed_tokens.weight"),
           gpt.same("decoder.final_layernorm.weight", "model.norm.weight")]
    if build.untie_embeddings_and_output_weights:
        out.append(gpt.same("output_layer.weight", "lm_head.weight"))
    for i in range(config.num_layers):
        mc, hp = f"decoder.layers.{i}.", f"model.layers.{i}."
        out += [gpt.same(mc + "input_layernorm.weight", hp + "input_layernorm.weight"),
                gpt.same(mc + "pre_mlp_layernorm.weight", hp + "post_attention_layernorm.weight"),
                gpt.same(mc + "mlp.router.weight", hp + "mlp.router.weight"),
                gpt.same(mc + "mlp.router.bias", hp + "mlp.router.bias")]
        out += _attention(config, mc, hp) + _experts(config, mc, hp)
    return out


def _matches(saved: dict) -> bool:
    return bool(saved.get("num_experts") and saved.get("softmax_type") == "learnable" and saved.get("quick_geglu"))


FAMILY = Family(name="gpt-oss", presets=PRESETS, hf_model_type="gpt_oss", hf_architecture="GptOssForCausalLM",
                flags_from_hf=flags_from_hf, hf_config=hf_config, hf_map=hf_map, matches=_matches,
                build_context=build_context)
