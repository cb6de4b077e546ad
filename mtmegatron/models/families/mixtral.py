"""Mixtral (``--model mixtral``; HF ``MixtralForCausalLM``): Llama's attention, every layer MoE with experts
``block_sparse_moe.experts.<e>.{w1,w3,w2}`` (gate, up, down) and router ``block_sparse_moe.gate``.
May assume: what gpt.py assumes.
"""

from __future__ import annotations

import functools

import mtmegatron.models.families.gpt as gpt
from mtmegatron.models.families.base import Family

_MOE = dict(rotary_base=1000000, moe_token_dispatcher_type="alltoall", moe_router_load_balancing_type="aux_loss",
            moe_aux_loss_coeff=1e-2, moe_router_topk=2)

PRESETS = {
    "tiny": dict(gpt.LLAMA_COMMON, **gpt.TINY_DENSE, **_MOE, num_experts=4),
    "8x7b": dict(gpt.LLAMA_COMMON, num_layers=32, hidden_size=4096, ffn_hidden_size=14336, num_attention_heads=32,
                 num_query_groups=8, seq_length=4096, max_position_embeddings=32768, vocab_size=32000, **_MOE,
                 num_experts=8),
}


def flags_from_hf(config: dict, **_) -> list[str]:
    return ["--model", FAMILY.name] + gpt.llama_like_flags(config) + gpt.moe_flags(
        config, config["num_local_experts"], config["intermediate_size"]) + [
        "--moe-aux-loss-coeff", repr(float(config.get("router_aux_loss_coef", 0.0)))]


def hf_config(config, build, **_) -> dict:
    return {**gpt.hf_config_base(FAMILY, config, build), "num_local_experts": config.num_moe_experts,
            "num_experts_per_tok": config.moe_router_topk, "router_aux_loss_coef": config.moe_aux_loss_coeff}


FAMILY = Family(name="mixtral", presets=PRESETS, hf_model_type="mixtral", hf_architecture="MixtralForCausalLM",
                flags_from_hf=flags_from_hf, hf_config=hf_config,
                hf_map=functools.partial(gpt.decoder_map, moe_prefix="block_sparse_moe", mlp_names=("w1", "w3", "w2")),
                matches=lambda saved: bool(saved.get("num_experts")))
