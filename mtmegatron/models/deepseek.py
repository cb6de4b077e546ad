"""Config fields and block specs beyond a uniform Llama/Mixtral stack: multi-latent attention (MLA), first-k
dense + MoE layers with their own FFN sizes, shared experts, the biased group-limited sigmoid router, and
multi-token prediction (MTP). Used for DeepSeek-V3, but every piece is switched by its own Megatron-LM flag.

Everything here is megatron-core 0.16's own: ``MLATransformerConfig``, the layer pattern from
``moe_layer_freq`` (dense layers build ``MLP`` with ``ffn_hidden_size``, routed experts ``moe_ffn_hidden_size``,
the shared expert ``moe_shared_expert_intermediate_size``), the MTP block layout of ``get_gpt_mtp_block_spec``;
every layer spec comes from ``models/layer_spec.build_layer_spec``.
May assume: flags validated (config/arguments.py); parallel state initialised when a spec is built.
"""

from __future__ import annotations

import argparse

from megatron.core.transformer.transformer_block import TransformerBlockSubmodules, get_num_layers_to_build
from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

from mtmegatron.models.moe_layers import moe_layer_pattern


def config_fields(args: argparse.Namespace) -> dict:
    """TransformerConfig fields for MoE routing extras, MTP and qk-layernorm (empty when all are off)."""
    fields = {}
    if args.qk_layernorm:
        fields["qk_layernorm"] = True
    if args.num_experts:
        fields.update(
            moe_layer_freq=args.moe_layer_freq,
            moe_shared_expert_intermediate_size=args.moe_shared_expert_intermediate_size,
            moe_router_score_function=args.moe_router_score_function,
            moe_router_enable_expert_bias=args.moe_router_enable_expert_bias,
            moe_router_bias_update_rate=args.moe_router_bias_update_rate,
            moe_router_num_groups=args.moe_router_num_groups,
            moe_router_group_topk=args.moe_router_group_topk,
            moe_router_topk_scaling_factor=args.moe_router_topk_scaling_factor,
            moe_router_dtype="fp32" if args.moe_router_score_function == "sigmoid" else None,
        )
    if args.mtp_num_layers:
        fields.update(mtp_num_layers=args.mtp_num_layers, mtp_loss_scaling_factor=args.mtp_loss_scaling_factor)
    return fields


def mla_fields(args: argparse.Namespace) -> dict:
    """MLATransformerConfig's own fields (q/kv LoRA ranks, head dims, RoPE or YaRN)."""
    return dict(
        q_lora_rank=args.q_lora_rank,
        kv_lora_rank=args.kv_lora_rank,
        qk_head_dim=args.qk_head_dim,
        qk_pos_emb_head_dim=args.qk_pos_emb_head_dim,
        v_head_dim=args.v_head_dim,
        rope_type=args.rope_type,
        rotary_base=args.rotary_base,
        rotary_scaling_factor=args.rotary_scaling_factor,
        original_max_position_embeddings=args.original_max_position_embeddings,
        beta_fast=args.beta_fast,
        beta_slow=args.beta_slow,
        mscale=args.mscale,
        mscale_all_dim=args.mscale_all_dim,
    )


def needs_block_spec(args: argparse.Namespace) -> bool:
    """Whether a model with experts has dense layers too (then the stack is not one repeated layer)."""
    return bool(args.num_experts) and 0 in moe_layer_pattern(args.num_layers, args.num_experts, args.moe_layer_freq)


def decoder_block_spec(config, args: argparse.Namespace, vp_stage: int | None):
    """This pipeline stage's slice of the dense/MoE layer pattern, each layer from ``build_layer_spec``."""
    from megatron.core.transformer.transformer_block import LayerNormImpl  # what a uniform stack gets

    from mtmegatron.models.layer_spec import build_layer_spec

    offset = get_transformer_layer_offset(config, vp_stage=vp_stage)
    count = get_num_layers_to_build(config, vp_stage=vp_stage)
    kinds = moe_layer_pattern(args.num_layers, args.num_experts, args.moe_layer_freq)[offset:offset + count]
    return TransformerBlockSubmodules(layer_specs=[build_layer_spec(args, "moe" if kind else "dense")
                                                   for kind in kinds], layer_norm=LayerNormImpl)


def mtp_block_spec(config, args: argparse.Namespace, vp_stage: int | None):
    """The MTP block on the stage that holds it (megatron-core puts every MTP layer on the last pipeline stage);
    None elsewhere or without ``--mtp-num-layers``. Each layer is ``build_layer_spec(args, "mtp")``."""
    if not config.mtp_num_layers:
        return None
    from megatron.core.transformer.multi_token_prediction import (MultiTokenPredictionBlockSubmodules,
                                                                  get_mtp_num_layers_to_build)

    from mtmegatron.models.layer_spec import build_layer_spec

    count = get_mtp_num_layers_to_build(config, vp_stage=vp_stage)
    if count == 0:
        return None
    assert count == config.mtp_num_layers, "megatron-core builds all MTP layers on one pipeline stage"
    return MultiTokenPredictionBlockSubmodules(layer_specs=[build_layer_spec(args, "mtp") for _ in range(count)])
