"""Builds megatron-core GPT models (Llama-3, Mixtral, DeepSeek-V3 shapes) from parsed pretrain flags.

One ``TransformerConfig`` from the flags, the layer specs from ``models/layer_spec.build_layer_spec`` (one
repeated layer, or DeepSeek's per-stage dense/MoE block and the MTP block), one ``GPTModel`` per virtual
pipeline stage. GPTModel's own arguments (vocabulary, position embedding, tied embeddings), the RoPE scaling and
the family's build context come from one ``ModelBuild`` (models/section.py) filled here, the layer specs and FP8
from one ``LayerChoice`` (``layer_choice``: the layer and FP8 flags with the TE-layers decision and the FP8
executor), where the weights are born from ``Initialization``; LLaVA's builder takes its ``LlavaBuild``
(families/llava/section.py); Qwen-VL's still reads the flags.
May assume: megatron-core parallel state is initialised and the backend bridge is active.
"""

from __future__ import annotations

import argparse
import contextlib

from megatron.core import parallel_state
from megatron.core.models.gpt import GPTModel
from megatron.core.transformer import MLATransformerConfig, TransformerConfig
from megatron.core.transformer.transformer_block import TransformerBlockSubmodules, get_num_layers_to_build

from mtmegatron.fp8.section import Fp8
from mtmegatron.fp8.spec import choose_executor, keep_layers_in_bf16, te_config_fields
from mtmegatron.models import deepseek, fusions, initialization
from mtmegatron.models import families
from mtmegatron.models.config_from_flags import deepseek_fields, mla_fields, transformer_config_kwargs
from mtmegatron.models.layer_spec import build_layer_spec
from mtmegatron.models.section import Fusions, Initialization, LayerChoice, Layers, ModelBuild
from mtmegatron.models.vocab import install_vocab_padding
from mtmegatron.models.zero_centered_norm import ZeroCenteredNorm


def transformer_config(args: argparse.Namespace) -> TransformerConfig:
    """Flags by field name (models/config_from_flags.py), then mtmegatron's decisions for this backend."""
    config_class = MLATransformerConfig if args.multi_latent_attention else TransformerConfig
    ours = dict(
        **initialization.config_fields(Initialization.of(args)),  # born on the device unless --use-cpu-initialization; --load skips
        overlap_p2p_comm=p2p_overlap_runs(args),
        batch_p2p_comm=not p2p_overlap_runs(args) and not _two_stage_interleaved(args),
        **fusions.config_fields(Fusions.of(args)),
        **deepseek_fields(args),  # MoE routing extras, MTP, qk-layernorm
        **(mla_fields(args) if args.multi_latent_attention else {}),
    )
    if args.num_experts and args.moe_ffn_hidden_size is None:
        ours["moe_ffn_hidden_size"] = args.ffn_hidden_size
    kwargs = transformer_config_kwargs(args, config_class, ours)
    choice = layer_choice(args)
    kwargs.update(te_config_fields(choice.fp8, choice.fp8_executor))
    return config_class(**kwargs)


def layer_choice(args: argparse.Namespace) -> LayerChoice:
    """The layer specs' inputs (models/section.py): the layer and FP8 flags, whether the layers are
    TransformerEngine's (decided at parse time) and the FP8 executor pretrain chose at start-up (chosen here, and
    not recorded, where no start-up chose it: convert, generate, the planner)."""
    fp8 = Fp8.of(args)
    executor = None
    if fp8.fp8:
        executor = args.fp8_executor_in_use or choose_executor(fp8, args.transformer_engine_layers)[0]
    return LayerChoice(layers=Layers.of(args), fp8=fp8, transformer_engine=args.transformer_engine_layers,
                       fp8_executor=executor)


def with_final_norm(spec, config: TransformerConfig, vp_stage, norm) -> TransformerBlockSubmodules:
    """The decoder block spec of ``spec`` (a layer spec or a block spec) with ``norm`` as its final norm."""
    if isinstance(spec, TransformerBlockSubmodules):
        return TransformerBlockSubmodules(layer_specs=spec.layer_specs, layer_norm=norm)
    return TransformerBlockSubmodules(layer_specs=[spec] * get_num_layers_to_build(config, vp_stage=vp_stage),
                                      layer_norm=norm)


def gpt_model_kwargs(build: ModelBuild) -> dict:
    """GPTModel's position-embedding arguments, from Megatron-LM's flags (as its gpt_builders passes them)."""
    return dict(
        position_embedding_type=build.position_embedding_type,
        rotary_percent=build.rotary_percent,
        rotary_base=build.rotary_base,
        rope_scaling=build.use_rope_scaling,
        rope_scaling_factor=build.rope_scaling_factor,
        seq_len_interpolation_factor=build.rotary_seq_len_interpolation_factor,
        fp16_lm_cross_entropy=build.fp16_lm_cross_entropy,
    )


def p2p_overlap_runs(args: argparse.Namespace) -> bool:
    """Megatron-LM overlaps the interleaved schedule's p2p communication by default; not over gloo (the cpu
    backend), where it corrupted the gradients: PP2 and PP4 with virtual stages gave grad norms of 59 and 37
    instead of ~1.2 at the first iterations (the same runs with --no-overlap-p2p-communication match one rank)."""
    from mtmegatron.backends.active import active_backend

    backend = active_backend()
    return bool(args.overlap_p2p_comm) and not (backend is not None and backend.dist_backend == "gloo")


def _two_stage_interleaved(args) -> bool:
    """Two pipeline stages with virtual stages: the previous and the next stage are the same peer, and one
    batched p2p call sends an activation forward and a gradient backward to it with the same shape. NCCL/MCCL
    (and gloo) match sends to receives in order per peer, so batched the two are silently swapped (Megatron-LM
    refuses this combination). Unbatched, megatron-core sends the two directions over different process groups
    in an even/odd order that cannot cross."""
    return args.pipeline_model_parallel_size == 2 and bool(args.virtual_pipeline_model_parallel_size)


def build_model_chunks(args: argparse.Namespace, config: TransformerConfig) -> list[GPTModel]:
    """One GPTModel per virtual pipeline stage held by this rank (a single one without VPP); for ``--model llava``
    one LLaVAModel per stage (models/families/llava/model.py). Built where models/initialization.py says the weights are born."""
    build = ModelBuild.of(args)
    family = families.get(build.model or "gpt")
    family_context = family.build_context(config, build)  # GPT-OSS: YaRN on a plain attention
    with initialization.birth_device(Initialization.of(args)), llama3_scaling(build), family_context:
        return _build_model_chunks(args, config, build, family)


def llama3_scaling(build: ModelBuild):
    """The Llama-3.x RoPE scaling values of the build for the RotaryEmbeddings built in this block
    (patches/llama3_rope_scaling_values.py)."""
    from mtmegatron.patches.llama3_rope_scaling_values import scaling_values

    if not build.use_rope_scaling:
        return contextlib.nullcontext()
    return scaling_values(build.rope_scaling_low_freq_factor, build.rope_scaling_high_freq_factor,
                          build.rope_scaling_original_max_position_embeddings)


def _build_model_chunks(args: argparse.Namespace, config: TransformerConfig, build: ModelBuild,
                        family: families.Family) -> list[GPTModel]:
    choice = layer_choice(args)
    if family.vision_encoder == "packed":
        from mtmegatron.models.families.qwen2_vl.model import build_qwen_vl_chunks

        return build_qwen_vl_chunks(args, config, choice)
    if family.is_multimodal:
        from mtmegatron.models.families.llava.model import build_llava_chunks
        from mtmegatron.models.families.llava.section import LlavaBuild

        return build_llava_chunks(config, build, choice, LlavaBuild.of(args))
    if family.model_builder is not None:  # layers no flag expresses (models/families/gemma3/)
        return family.model_builder(config, build, choice, Fusions.of(args))
    spec = build_layer_spec(choice, "moe" if args.num_experts else "dense")
    fused = fusions.uses_our_cross_entropy(Fusions.of(args))
    if fused:
        from mtmegatron.models.fused_spec import install_fused_loss
    num_chunks = config.virtual_pipeline_model_parallel_size or 1
    chunks = []
    for vp_stage in range(num_chunks):
        vp = vp_stage if config.virtual_pipeline_model_parallel_size else None
        if deepseek.needs_block_spec(choice.layers):  # first-k dense + MoE layers: a per-stage layer list
            spec = deepseek.decoder_block_spec(config, choice, vp)
        if args.layernorm_zero_centered_gamma:  # the block's final norm too (megatron's default is a torch norm)
            spec = with_final_norm(spec, config, vp, ZeroCenteredNorm)
        chunks.append(
            GPTModel(
                config=config,
                transformer_layer_spec=spec,
                vocab_size=build.padded_vocab_size,  # models/vocab.py: padding rows zero, their logits -inf
                max_sequence_length=build.max_position_embeddings,
                pre_process=parallel_state.is_pipeline_first_stage(ignore_virtual=False, vp_stage=vp),
                post_process=parallel_state.is_pipeline_last_stage(ignore_virtual=False, vp_stage=vp),
                share_embeddings_and_output_weights=not build.untie_embeddings_and_output_weights,
                **gpt_model_kwargs(build),
                vp_stage=vp,
                mtp_block_spec=deepseek.mtp_block_spec(config, choice, vp),
            )
        )
        install_vocab_padding(chunks[-1], build.vocab_size)
        if fused:
            install_fused_loss(chunks[-1])
        keep_layers_in_bf16(chunks[-1], choice.fp8, config.num_layers)
    return chunks
