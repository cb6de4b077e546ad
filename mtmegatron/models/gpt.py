"""Builds megatron-core GPT models (Llama-3, Mixtral, DeepSeek-V3 shapes) from parsed pretrain flags.

One ``TransformerConfig`` from the flags, the layer specs from ``models/layer_spec.build_layer_spec`` (one
repeated layer, or DeepSeek's per-stage dense/MoE block and the MTP block), one ``GPTModel`` per virtual
pipeline stage.
May assume: megatron-core parallel state is initialised and the backend bridge is active.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from megatron.core import parallel_state
from megatron.core.models.gpt import GPTModel
from megatron.core.transformer import MLATransformerConfig, TransformerConfig

from mtmegatron.fp8.spec import keep_layers_in_bf16, te_config_fields
from mtmegatron.models import deepseek, family_args
from mtmegatron.models.layer_spec import build_layer_spec
from mtmegatron.models.vocab import install_vocab_padding


def transformer_config(args: argparse.Namespace) -> TransformerConfig:
    moe = {}
    if args.num_experts:
        moe = dict(
            num_moe_experts=args.num_experts,
            moe_router_topk=args.moe_router_topk,
            moe_token_dispatcher_type=args.moe_token_dispatcher_type,
            moe_ffn_hidden_size=args.moe_ffn_hidden_size or args.ffn_hidden_size,
            moe_router_load_balancing_type=args.moe_router_load_balancing_type,
            moe_aux_loss_coeff=args.moe_aux_loss_coeff,
            moe_grouped_gemm=False,
            expert_model_parallel_size=args.expert_model_parallel_size,
        )
    fusion = {"apply_rope_fusion": False}
    if args.transformer_impl == "mtmegatron":  # megatron-core's fusion switches, served by mtmegatron.ops
        fusion["apply_rope_fusion"] = args.position_embedding_type == "rope"
        if args.num_experts:
            fusion.update(moe_permute_fusion=True, moe_router_fusion=True)
    dtype = torch.bfloat16 if args.bf16 else torch.float16 if args.fp16 else torch.float32
    moe.update(deepseek.config_fields(args))  # MoE routing extras, MTP, qk-layernorm
    config_class, mla = TransformerConfig, {}
    if args.multi_latent_attention:
        config_class, mla = MLATransformerConfig, deepseek.mla_fields(args)
        fusion["apply_rope_fusion"] = False  # megatron's MLA RoPE fusion needs its Triton/TE kernels
    return config_class(
        num_layers=args.num_layers,
        hidden_size=args.hidden_size,
        ffn_hidden_size=args.ffn_hidden_size,
        num_attention_heads=args.num_attention_heads,
        num_query_groups=args.num_query_groups,
        normalization=args.normalization,
        layernorm_epsilon=args.norm_epsilon,
        gated_linear_unit=args.swiglu,
        activation_func=F.silu if args.swiglu else F.gelu,
        add_bias_linear=not args.disable_bias_linear,
        hidden_dropout=args.hidden_dropout,
        attention_dropout=args.attention_dropout,
        init_method_std=args.init_method_std,
        tensor_model_parallel_size=args.tensor_model_parallel_size,
        pipeline_model_parallel_size=args.pipeline_model_parallel_size,
        virtual_pipeline_model_parallel_size=args.virtual_pipeline_model_parallel_size,
        context_parallel_size=args.context_parallel_size,
        cp_comm_type=args.cp_comm_type,
        sequence_parallel=args.sequence_parallel,
        params_dtype=dtype,
        pipeline_dtype=dtype,
        bf16=args.bf16,
        fp16=args.fp16,
        use_cpu_initialization=True,
        bias_activation_fusion=False,
        masked_softmax_fusion=False,
        persist_layer_norm=False,
        bias_dropout_fusion=False,
        gradient_accumulation_fusion=False,
        deallocate_pipeline_outputs=True,
        batch_p2p_comm=not _two_stage_interleaved(args),
        # activation recompute (rules in training/memory_flags.py); megatron-core's checkpoint functions replay
        # the dropout masks through the RNG tracker (the cpu bridge's tracker holds real generators)
        recompute_granularity=args.recompute_granularity,
        recompute_method=args.recompute_method,
        recompute_num_layers=args.recompute_num_layers,
        recompute_modules=args.recompute_modules,
        **moe,
        **fusion,
        **te_config_fields(args),
        **mla,
        **family_args.transformer_config_fields(args),  # head dim, qkv bias, no init before a load
    )


def _two_stage_interleaved(args) -> bool:
    """Two pipeline stages with virtual stages: the previous and the next stage are the same peer, and one
    batched p2p call sends an activation forward and a gradient backward to it with the same shape. NCCL/MCCL
    (and gloo) match sends to receives in order per peer, so batched the two are silently swapped (Megatron-LM
    refuses this combination). Unbatched, megatron-core sends the two directions over different process groups
    in an even/odd order that cannot cross."""
    return args.pipeline_model_parallel_size == 2 and bool(args.virtual_pipeline_model_parallel_size)


def build_model_chunks(args: argparse.Namespace, config: TransformerConfig) -> list[GPTModel]:
    """One GPTModel per virtual pipeline stage held by this rank (a single one without VPP); for ``--model llava``
    one LLaVAModel per stage (models/llava.py)."""
    if args.model == "llava":
        from mtmegatron.models.llava import build_llava_chunks

        return build_llava_chunks(args, config)
    spec = build_layer_spec(args, "moe" if args.num_experts else "dense")
    fused = args.transformer_impl == "mtmegatron"
    if fused:
        from mtmegatron.models.fused_spec import install_fused_loss
    num_chunks = args.virtual_pipeline_model_parallel_size or 1
    chunks = []
    for vp_stage in range(num_chunks):
        vp = vp_stage if args.virtual_pipeline_model_parallel_size else None
        if deepseek.needs_block_spec(args):  # first-k dense + MoE layers: a per-stage layer list
            spec = deepseek.decoder_block_spec(config, args, vp)
        chunks.append(
            GPTModel(
                config=config,
                transformer_layer_spec=spec,
                vocab_size=args.padded_vocab_size,  # models/vocab.py: padding rows zero, their logits -inf
                max_sequence_length=args.max_position_embeddings,
                pre_process=parallel_state.is_pipeline_first_stage(ignore_virtual=False, vp_stage=vp),
                post_process=parallel_state.is_pipeline_last_stage(ignore_virtual=False, vp_stage=vp),
                share_embeddings_and_output_weights=not args.untie_embeddings_and_output_weights,
                position_embedding_type=args.position_embedding_type,
                rotary_base=args.rotary_base,
                vp_stage=vp,
                mtp_block_spec=deepseek.mtp_block_spec(config, args, vp),
                **family_args.gpt_model_fields(args),  # Llama-3.x RoPE scaling
            )
        )
        install_vocab_padding(chunks[-1], args.vocab_size)
        if fused:
            install_fused_loss(chunks[-1])
        keep_layers_in_bf16(chunks[-1], args)
    return chunks
