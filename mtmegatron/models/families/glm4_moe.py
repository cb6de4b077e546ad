"""GLM-4.5 (``--model glm4.5``; HF ``Glm4MoeForCausalLM``, model_type ``glm4_moe``): GQA attention with q/k/v
biases, optional per-head q/k RMSNorm (``use_qk_norm``), partial rotary, first-k dense layers then MoE layers with
one shared expert and DeepSeek-V3's sigmoid router (expert bias, group-limited top-k, normalised top-k weights,
routed scaling factor), untied embeddings, and an MTP layer in the release.

Every piece is a megatron-core 0.16 config field already: ``--add-qkv-bias``, ``--qk-layernorm``,
``--rotary-percent`` (HF applies ``rotate_half`` RoPE to the first ``head_dim * partial_rotary_factor`` channels of
each head and passes the rest through; megatron-core's non-interleaved RoPE with ``rotary_percent`` does the same
to the same channels, with the same ``cat([freqs, freqs])`` layout, so no rows are permuted), ``--moe-layer-freq``,
``--moe-shared-expert-intermediate-size`` (``n_shared_experts * moe_intermediate_size``, no gate),
``--moe-router-score-function sigmoid --moe-router-enable-expert-bias`` (``e_score_correction_bias`` ->
``router.expert_bias``), ``--moe-router-num-groups/--moe-router-group-topk``, ``--moe-router-topk-scaling-factor``.
HF config facts: a config without ``partial_rotary_factor`` means 0.5 (Glm4MoeConfig's default); the field is read
at the top level (the release's config.json) or inside ``rope_parameters`` (transformers 5). Group-limited
routing: HF scores a group by its top-2 experts, megatron by its top ``topk/group_topk``: refused unless those
agree (the release has one group). ``attention_bias: false`` is refused: the presets carry q/k/v biases and no
flag switches them off. MTP: the layer ``num_hidden_layers + k`` maps as DeepSeek-V3's does (enorm, hnorm,
eh_proj, shared_head.norm; the embedding and head copies there are written on the way back), converted when the
checkpoint holds its tensors.
Presets ``air`` (GLM-4.5-Air, 106B-A12B) and ``full`` (GLM-4.5, 355B-A32B) are the released config.json shapes as
remembered (not read from the published files here): Air without q/k norm, the 355B model with it.
May assume: what gpt.py assumes.
"""

from __future__ import annotations

import sys

import mtmegatron.models.families.gpt as gpt
from mtmegatron.models.families.base import ConversionError, Entry, Family
from mtmegatron.models.families.shared.mtp import mtp_map
from mtmegatron.models.families.shared.router import group_limited_flags

_COMMON = dict(
    gpt.LLAMA_COMMON, rotary_base=1000000, rotary_percent=0.5, add_qkv_bias=True,
    moe_router_score_function="sigmoid", moe_router_enable_expert_bias=True, moe_router_bias_update_rate=1e-3,
    moe_router_load_balancing_type="seq_aux_loss", moe_aux_loss_coeff=1e-4, moe_token_dispatcher_type="alltoall",
    mtp_loss_scaling_factor=0.1,
)
_REAL = dict(seq_length=4096, max_position_embeddings=131072, vocab_size=151552, num_attention_heads=96,
             num_query_groups=8, kv_channels=128, moe_router_topk=8, mtp_num_layers=1)

PRESETS = {
    # 1 dense + 3 MoE layers; dense FFN 160, routed experts 32, shared expert 32; head dim 32 (hidden/heads 16),
    # RoPE on 16 of its 32 channels
    "tiny": dict(_COMMON, num_layers=4, hidden_size=64, ffn_hidden_size=160, num_attention_heads=4,
                 num_query_groups=2, kv_channels=32, seq_length=32, max_position_embeddings=64, vocab_size=256,
                 moe_layer_freq=[0] + [1] * 3, num_experts=8, moe_router_topk=4, moe_ffn_hidden_size=32,
                 moe_shared_expert_intermediate_size=32, moe_router_topk_scaling_factor=2.5, mtp_num_layers=1),
    "air": dict(_COMMON, **_REAL, num_layers=46, hidden_size=4096, ffn_hidden_size=10944,
                moe_layer_freq=[0] + [1] * 45, num_experts=128, moe_ffn_hidden_size=1408,
                moe_shared_expert_intermediate_size=1408, moe_router_topk_scaling_factor=1.0),
    "full": dict(_COMMON, **_REAL, num_layers=92, hidden_size=5120, ffn_hidden_size=12288, qk_layernorm=True,
                 moe_layer_freq=[0] * 3 + [1] * 89, num_experts=160, moe_ffn_hidden_size=1536,
                 moe_shared_expert_intermediate_size=1536, moe_router_topk_scaling_factor=2.5),
}


def partial_rotary_factor(config: dict) -> float:
    """The config's partial rotary factor (top level, or in ``rope_parameters``; absent: Glm4MoeConfig's 0.5)."""
    params = config.get("rope_parameters") or {}
    value = config.get("partial_rotary_factor", params.get("partial_rotary_factor"))
    return 0.5 if value is None else float(value)


def flags_from_hf(config: dict, with_mtp: bool = True, names=None, source: str | None = None, **_) -> list[str]:
    """``names``: the checkpoint's tensor names (its MTP layer, HF layer num_hidden_layers, is converted when it
    holds one)."""
    require = gpt.require
    layers = config["num_hidden_layers"]
    if names is not None:
        with_mtp = any(name.startswith(f"model.layers.{layers}.") for name in names)
        if config.get("num_nextn_predict_layers") and not with_mtp:
            print(f"mtmegatron convert: {source} has no MTP layer weights; converting without MTP", file=sys.stderr)
    require(config.get("attention_bias", False) is True,
            f"config.json field attention_bias = {config.get('attention_bias')!r}: --model glm4.5 carries q/k/v "
            f"biases (the release's) and no flag switches them off; not converted")
    require(config.get("scoring_func", "sigmoid") == "sigmoid",
            f"config.json field scoring_func = {config.get('scoring_func')!r}: only the sigmoid router is "
            f"supported; not converted")
    topk = config["num_experts_per_tok"]
    require(config.get("norm_topk_prob", True) or topk == 1,
            "config.json field norm_topk_prob = false: megatron's sigmoid router always normalises the top-k "
            "weights; not converted")
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    factor = partial_rotary_factor(config)
    require(0 < factor <= 1 and int(head_dim * factor) % 2 == 0,
            f"config.json field partial_rotary_factor = {factor!r}: head_dim {head_dim} x factor must be a positive "
            f"even channel count; not converted")
    # the two fields gpt.check_representable refuses for the Llama layout are ours: --rotary-percent, --add-qkv-bias
    plain = {k: v for k, v in config.items() if k not in ("partial_rotary_factor", "attention_bias")}
    first_dense = config.get("first_k_dense_replace", 0)
    experts, moe_ffn = config["n_routed_experts"], config["moe_intermediate_size"]
    flags = ["--model", FAMILY.name] + gpt.llama_like_flags(plain) + [
        "--add-qkv-bias", "--rotary-percent", repr(factor),
        "--moe-layer-freq", f"([0]*{first_dense}+[1]*{layers - first_dense})",
        *gpt.moe_flags(config, experts, moe_ffn),
        "--moe-shared-expert-intermediate-size", str((config.get("n_shared_experts") or 0) * moe_ffn),
        "--moe-router-score-function", "sigmoid", "--moe-router-enable-expert-bias",
        "--moe-router-topk-scaling-factor", repr(float(config.get("routed_scaling_factor", 1.0))),
    ]
    if config.get("use_qk_norm", False):
        flags.append("--qk-layernorm")
    flags += group_limited_flags(config)
    return flags + ["--mtp-num-layers", str(config.get("num_nextn_predict_layers") or 0 if with_mtp else 0)]


def _first_dense(config) -> int:
    """How many leading dense layers (HF's first_k_dense_replace); other layer patterns have no HF spelling."""
    freq = config.moe_layer_freq
    pattern = freq if isinstance(freq, list) else [1 if i % freq == 0 else 0 for i in range(config.num_layers)]
    first = pattern.index(1) if 1 in pattern else len(pattern)
    if pattern != [0] * first + [1] * (len(pattern) - first):
        raise ConversionError(f"--moe-layer-freq {freq!r}: GLM-4.5's config.json has only first_k_dense_replace "
                              f"(k dense layers, then MoE); this pattern has no equivalent")
    return first


def hf_config(config, build, **_) -> dict:
    out = gpt.hf_config_base(FAMILY, config, build)
    shared = config.moe_shared_expert_intermediate_size or 0
    if shared % config.moe_ffn_hidden_size:
        raise ConversionError(f"--moe-shared-expert-intermediate-size {shared} is not a multiple of "
                              f"--moe-ffn-hidden-size {config.moe_ffn_hidden_size} (HF: n_shared_experts)")
    out.update(
        attention_bias=bool(config.add_qkv_bias), use_qk_norm=bool(config.qk_layernorm),
        partial_rotary_factor=build.rotary_percent,
        rope_parameters={"rope_type": "default", "rope_theta": float(build.rotary_base),
                         "partial_rotary_factor": build.rotary_percent},
        first_k_dense_replace=_first_dense(config), n_routed_experts=config.num_moe_experts,
        num_experts_per_tok=config.moe_router_topk, moe_intermediate_size=config.moe_ffn_hidden_size,
        n_shared_experts=shared // config.moe_ffn_hidden_size, n_group=config.moe_router_num_groups or 1,
        topk_group=config.moe_router_group_topk or 1,
        routed_scaling_factor=config.moe_router_topk_scaling_factor or 1.0, norm_topk_prob=True,
        num_nextn_predict_layers=config.mtp_num_layers or 0,
    )
    return out


def hf_map(config, build, rope_interleave: bool = True, layout=None, **_) -> list[Entry]:
    """gpt.decoder_map (GQA with q/k/v biases, q/k norms, shared expert, router + expert bias) and the MTP extras
    (families/shared/mtp.py, DeepSeek-V3's layout)."""
    return gpt.decoder_map(config, build) + mtp_map(config.num_layers, config.mtp_num_layers,
                                                    build.untie_embeddings_and_output_weights)


FAMILY = Family(name="glm4.5", presets=PRESETS, hf_model_type="glm4_moe", hf_architecture="Glm4MoeForCausalLM",
                flags_from_hf=flags_from_hf, hf_config=hf_config, hf_map=hf_map,
                matches=lambda saved: bool(saved.get("num_experts") and saved.get("add_qkv_bias")
                                           and saved.get("moe_router_enable_expert_bias")
                                           and not saved.get("multi_latent_attention")))
