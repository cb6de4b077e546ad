"""Flag-level pieces of the DeepSeek-V3 features (pure Python, imported before megatron-core is): the
``--moe-layer-freq`` normalization (its parser and the layer pattern: models/moe_layers.py), and the validation
of MLA / router / MTP flags.
May assume: nothing beyond the parsed argparse namespace.
"""

from __future__ import annotations

import argparse

from mtmegatron.models.moe_layers import parse_moe_layer_freq

# flags where 0 means "off" (so an explicit flag can switch off what a preset turns on)
_ZERO_IS_NONE = ("q_lora_rank", "moe_shared_expert_intermediate_size", "moe_router_num_groups",
                 "moe_router_group_topk", "mtp_num_layers")


def normalize_deepseek_args(args: argparse.Namespace) -> None:
    """After preset filling: parse --moe-layer-freq; 0 -> None for the switch-off-able sizes."""
    args.moe_layer_freq = parse_moe_layer_freq(args.moe_layer_freq)
    for field in _ZERO_IS_NONE:
        if getattr(args, field) == 0:
            setattr(args, field, None)


def check_deepseek_args(args: argparse.Namespace, error) -> None:
    """Raise ``error(message)`` for an inconsistent MLA / MoE-pattern / router / MTP combination."""
    if isinstance(args.moe_layer_freq, list) and len(args.moe_layer_freq) != args.num_layers:
        raise error(f"--moe-layer-freq lists {len(args.moe_layer_freq)} layers but --num-layers is {args.num_layers}")
    if isinstance(args.moe_layer_freq, int) and args.moe_layer_freq < 1:
        raise error("--moe-layer-freq must be >= 1")
    experts = args.num_experts
    if args.moe_router_enable_expert_bias and args.moe_router_score_function != "sigmoid":
        raise error("--moe-router-enable-expert-bias needs --moe-router-score-function sigmoid")
    groups, group_topk = args.moe_router_num_groups, args.moe_router_group_topk
    if (groups is None) != (group_topk is None):
        raise error("--moe-router-num-groups and --moe-router-group-topk go together")
    if groups is not None and experts:
        if experts % groups:
            raise error(f"--moe-router-num-groups {groups} does not divide --num-experts {experts}")
        if not 1 <= group_topk <= groups:
            raise error(f"--moe-router-group-topk {group_topk} must be between 1 and --moe-router-num-groups {groups}")
        if args.moe_router_topk % group_topk:
            raise error(f"--moe-router-group-topk {group_topk} does not divide --moe-router-topk {args.moe_router_topk}")
        if groups % args.expert_model_parallel_size and args.expert_model_parallel_size % groups:
            raise error(f"--moe-router-num-groups {groups} and --expert-model-parallel-size "
                        f"{args.expert_model_parallel_size}: one must divide the other")
    if args.multi_latent_attention:
        if args.position_embedding_type != "rope":
            raise error("--multi-latent-attention needs --position-embedding-type rope (MLA applies RoPE itself)")
        if args.group_query_attention and args.num_query_groups != args.num_attention_heads:
            raise error("--multi-latent-attention does not take --group-query-attention (its KV is a latent)")
    if args.mtp_num_layers is not None and args.mtp_num_layers < 0:
        raise error("--mtp-num-layers must be >= 0 (0: no MTP)")
    if args.mtp_num_layers and args.num_layers_per_virtual_pipeline_stage is not None:
        raise error("--mtp-num-layers with --num-layers-per-virtual-pipeline-stage is not supported here")
