"""Qwen3-MoE (``--model qwen3-moe``; HF ``Qwen3MoeForCausalLM``): Qwen3's attention, every layer MoE
(``mlp.experts.<e>``, router ``mlp.gate``, no shared expert), the softmax top-k router with ``norm_topk_prob``
= megatron's default softmax router (top-k of the logits, then softmax over those).
May assume: what gpt.py assumes.
"""

from __future__ import annotations

import mtmegatron.models.families.gpt as gpt
from mtmegatron.models.families.base import Family
from mtmegatron.models.families.shared.qwen import QWEN3_COMMON, QWEN3_TINY, qwen3_config

_COMMON = dict(QWEN3_COMMON, moe_token_dispatcher_type="alltoall", moe_router_load_balancing_type="aux_loss",
               moe_aux_loss_coeff=1e-3)

PRESETS = {
    "tiny": dict(_COMMON, **QWEN3_TINY, num_experts=8, moe_router_topk=2, moe_ffn_hidden_size=64),
    "30b-a3b": dict(_COMMON, num_layers=48, hidden_size=2048, ffn_hidden_size=6144, num_attention_heads=32,
                    num_query_groups=4, kv_channels=128, num_experts=128, moe_router_topk=8, moe_ffn_hidden_size=768),
    "235b-a22b": dict(_COMMON, num_layers=94, hidden_size=4096, ffn_hidden_size=12288, num_attention_heads=64,
                      num_query_groups=4, kv_channels=128, num_experts=128, moe_router_topk=8,
                      moe_ffn_hidden_size=1536),
}


def flags_from_hf(config: dict, **_) -> list[str]:
    gpt.require(config.get("norm_topk_prob", False),
                "config.json field norm_topk_prob = false: megatron's softmax router normalises the top-k "
                "weights; not converted")
    experts = config.get("num_experts") or config["num_local_experts"]  # transformers 5 renamed it
    return ["--model", FAMILY.name] + gpt.llama_like_flags(config) + ["--qk-layernorm"] + gpt.moe_flags(
        config, experts, config["moe_intermediate_size"]) + [
        "--moe-router-score-function", "softmax",
        "--moe-aux-loss-coeff", repr(float(config.get("router_aux_loss_coef", 0.0)))]


def hf_config(config, build, **_) -> dict:
    return {**qwen3_config(FAMILY, config, build), "num_experts": config.num_moe_experts,
            "num_local_experts": config.num_moe_experts, "num_experts_per_tok": config.moe_router_topk,
            "moe_intermediate_size": config.moe_ffn_hidden_size, "norm_topk_prob": True, "decoder_sparse_step": 1,
            "mlp_only_layers": [], "router_aux_loss_coef": config.moe_aux_loss_coeff}


FAMILY = Family(name="qwen3-moe", presets=PRESETS, hf_model_type="qwen3_moe", hf_architecture="Qwen3MoeForCausalLM",
                flags_from_hf=flags_from_hf, hf_config=hf_config, hf_map=gpt.decoder_map,
                matches=lambda saved: bool(saved.get("num_experts") and saved.get("qk_layernorm")))
