"""megatron-core config dataclasses filled from the pretrain flags by field name, as Megatron-LM does.

Every ``TransformerConfig`` / ``MLATransformerConfig`` / ``OptimizerConfig`` / ``DistributedDataParallelConfig``
field that has a flag of the same dest takes the flag's value; the few renamed or derived fields follow
Megatron-LM's ``core_transformer_config_from_args`` and ``get_model``. mtmegatron's own decisions (dtype,
host-side initialisation, which fusions run on this backend, DeepSeek extras, FP8 through TE) are applied on
top, except where the user gave that field's flag: the user's flag always wins.
May assume: validated flags (config/arguments.py); the backend is active when ``transformer_config`` runs.
"""

from __future__ import annotations

import argparse
import dataclasses

import torch
import torch.nn.functional as F
from megatron.core.transformer.enums import AttnBackend

# FP8 fields are set by fp8/spec.te_config_fields only when TE runs the GEMMs; our own FP8 executors keep the
# config FP8-free (megatron-core would otherwise look for TE)
_FP8_FIELDS = frozenset({"fp8", "fp8_recipe", "fp8_margin", "fp8_amax_history_len", "fp8_amax_compute_algo",
                         "fp8_wgrad", "fp8_dot_product_attention", "fp8_multi_head_attention", "tp_only_amax_red",
                         "first_last_layers_bf16", "num_layers_at_start_in_bf16", "num_layers_at_end_in_bf16",
                         "fp8_param", "fp8_param_gather"})
_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "fp8": torch.uint8}


def params_dtype(args: argparse.Namespace) -> torch.dtype:
    return torch.bfloat16 if args.bf16 else torch.float16 if args.fp16 else torch.float32


def by_field_name(config_class, args: argparse.Namespace, skip=frozenset()) -> dict:
    return {f.name: getattr(args, f.name) for f in dataclasses.fields(config_class)
            if f.init and hasattr(args, f.name) and f.name not in skip}


def _megatron_renames(args: argparse.Namespace) -> dict:
    """Megatron-LM's core_transformer_config_from_args, for the fields whose flag has another name."""
    fields = dict(
        persist_layer_norm=not args.no_persist_layer_norm,
        deallocate_pipeline_outputs=True,
        pipeline_dtype=params_dtype(args),
        params_dtype=params_dtype(args),
        batch_p2p_comm=not args.overlap_p2p_comm,
        num_moe_experts=args.num_experts,
        num_layers_in_first_pipeline_stage=args.decoder_first_pipeline_num_layers,
        num_layers_in_last_pipeline_stage=args.decoder_last_pipeline_num_layers,
        layernorm_epsilon=args.layernorm_epsilon,
        add_bias_linear=args.add_bias_linear,
        num_query_groups=args.num_query_groups,
        kv_channels=args.kv_channels,
        gated_linear_unit=bool(args.swiglu),
        activation_func=F.silu if args.swiglu else F.gelu,
        bias_activation_fusion=args.bias_swiglu_fusion if args.swiglu else args.bias_gelu_fusion,
        attention_backend=AttnBackend[args.attention_backend],
        # megatron-core knows local/transformer_engine; our fused layers are local modules to it
        transformer_impl="local" if args.transformer_impl == "mtmegatron" else args.transformer_impl,
    )
    if args.squared_relu:
        from megatron.core.activations import squared_relu

        fields["activation_func"] = squared_relu
    elif args.quick_geglu:  # Megatron-LM: gated quick-GeLU
        from megatron.core.fusions.fused_bias_geglu import quick_gelu

        fields["activation_func"], fields["gated_linear_unit"] = quick_gelu, True
    if args.init_method_xavier_uniform:
        # Megatron-LM 0.16.1 passes scaled_init_method, a field megatron-core 0.16.1 no longer has (a TypeError
        # there); its successor is output_layer_init_method
        fields["init_method"] = fields["output_layer_init_method"] = torch.nn.init.xavier_uniform_
    return fields


def transformer_config_kwargs(args: argparse.Namespace, config_class, ours: dict) -> dict:
    """The keyword arguments of ``config_class``: flags by name, Megatron-LM's renames, then ``ours`` (mtmegatron's
    decisions) wherever the user did not give that field's flag."""
    kwargs = by_field_name(config_class, args, skip=_FP8_FIELDS)
    kwargs.update(_megatron_renames(args))
    given = args.given_flags
    kwargs.update({k: v for k, v in ours.items() if k not in given})
    if kwargs.get("rope_type", "") is None:
        kwargs.pop("rope_type")  # the config class's own default, as Megatron-LM does
    return kwargs


def optimizer_config_kwargs(args: argparse.Namespace, config_class, ours: dict) -> dict:
    kwargs = by_field_name(config_class, args, skip=_FP8_FIELDS)
    for field in ("main_grads_dtype", "main_params_dtype", "exp_avg_dtype", "exp_avg_sq_dtype"):
        if isinstance(kwargs.get(field), str):
            kwargs[field] = _DTYPES[kwargs[field]]
    kwargs["params_dtype"] = params_dtype(args)
    kwargs.update(ours)
    return kwargs


def ddp_config_kwargs(args: argparse.Namespace, config_class, ours: dict) -> dict:
    """Megatron-LM's get_model: by name, gradients reduced in fp32 per --accumulate-allreduce-grads-in-fp32
    (which bf16 turns on unless --grad-reduce-in-bf16, see arguments._derive)."""
    kwargs = by_field_name(config_class, args, skip=_FP8_FIELDS)
    kwargs.update(grad_reduce_in_fp32=args.accumulate_allreduce_grads_in_fp32,
                  check_for_nan_in_grad=args.check_for_nan_in_loss_and_grad,
                  check_for_large_grads=args.check_for_large_grads,
                  pad_buckets_for_high_nccl_busbw=args.ddp_pad_buckets_for_high_nccl_busbw,
                  reduce_scatter_with_fp32_accumulation=args.ddp_reduce_scatter_with_fp32_accumulation,
                  average_in_collective=args.ddp_average_in_collective)
    kwargs.update(ours)
    return kwargs


def deepseek_fields(args: argparse.Namespace) -> dict:
    """TransformerConfig fields for MoE routing extras, MTP and qk-layernorm, the flags models/deepseek.py's blocks
    use (empty when all are off)."""
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
