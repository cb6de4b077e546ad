"""Builds megatron-core 0.16's ``LLaVAModel`` (CLIP-style ViT + MLP projector + Llama-style GPT) from pretrain flags.

Nothing of LLaVA is re-implemented: the encoder is megatron-core's ``CLIPViTModel``, the projector its
``MultimodalProjector``, the merge of image and text embeddings its ``LLaVAModel``. What is ours: the three
``TransformerConfig``s from the flags, the layer specs (the language layers from ``layer_spec.build_layer_spec``
exactly as for ``--model llama3``; the encoder layers from the same builder with LayerNorm, biases, QuickGELU and
no attention mask — megatron-core's own local ViT spec uses a causal mask, which is not CLIP), and the pipeline
placement: the encoder and projector live on the first pipeline stage (first virtual chunk), the language
layers split over all stages, unevenly with ``--decoder-first-pipeline-num-layers``.
Built from the TransformerConfig, models/section.py's ``ModelBuild`` (vocabulary, RoPE) and ``LayerChoice`` (the
layer specs), and this folder's ``LlavaBuild`` (section.py: the vision tower, images, pipeline split, freezing).
May assume: validated flags (``models/families/llava/flags.py``), parallel state initialised, backend bridge active.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from megatron.core import parallel_state
from megatron.core.enums import ModelType
from megatron.core.models.multimodal.llava_model import LLaVAModel
from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear
from megatron.core.transformer import TransformerConfig
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.mlp import MLPSubmodules

from mtmegatron.models.families.llava.section import LlavaBuild
from mtmegatron.models.families.shared.vision_encoder import encoder_side, quick_gelu
from mtmegatron.models.layer_spec import build_layer_spec
from mtmegatron.models.section import LayerChoice, ModelBuild
from mtmegatron.models.vocab import install_vocab_padding

IMAGE_TOKEN_INDEX = -200  # the placeholder id of one image in input_ids (megatron-core's and LLaVA's)


def language_config(llava: LlavaBuild, config: TransformerConfig) -> TransformerConfig:
    """The GPT config of the language model; with ``--decoder-first-pipeline-num-layers`` the first stage
    (which also carries the encoder) gets that many layers and the others split the rest."""
    first = llava.decoder_first_pipeline_num_layers
    if first is None:
        return config
    rest = (config.num_layers - first) // (config.pipeline_model_parallel_size - 1)
    return dataclasses.replace(config, num_layers_in_first_pipeline_stage=first,
                               num_layers_in_last_pipeline_stage=rest)


def vision_config(llava: LlavaBuild, config: TransformerConfig) -> TransformerConfig:
    vision = encoder_side(
        config, num_layers=llava.vision_num_layers, hidden_size=llava.vision_hidden_size,
        ffn_hidden_size=llava.vision_ffn_hidden_size, num_attention_heads=llava.vision_num_attention_heads,
        num_query_groups=llava.vision_num_attention_heads,
        kv_channels=llava.vision_hidden_size // llava.vision_num_attention_heads, normalization="LayerNorm",
        layernorm_epsilon=llava.vision_norm_epsilon, gated_linear_unit=False,
        activation_func=quick_gelu if llava.vision_model_type == "clip" else _gelu_tanh, add_bias_linear=True,
        add_qkv_bias=True, qk_layernorm=False, apply_rope_fusion=False)
    vision.vision_model_type = llava.vision_model_type  # read by LLaVAModel (not a TransformerConfig field)
    return vision


def _gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")  # SigLIP's gelu_pytorch_tanh


def projector_config(config: TransformerConfig) -> TransformerConfig:
    """LLaVA-1.5's projector: Linear(vision -> hidden), GELU, Linear(hidden -> hidden), with biases."""
    return encoder_side(config, num_layers=1, ffn_hidden_size=config.hidden_size, gated_linear_unit=False,
                        activation_func=F.gelu, add_bias_linear=True, bias_activation_fusion=False)


def vision_layer_spec(choice: LayerChoice):
    """The encoder layer: our layer builder with the vision model's shape (LayerNorm, plain linears, the
    run's core attention) and no attention mask."""
    layers = dataclasses.replace(choice.layers, normalization="LayerNorm", qk_layernorm=False,
                                 multi_latent_attention=False, num_experts=None, transformer_impl="local")
    vision = LayerChoice(layers=layers, fp8=dataclasses.replace(choice.fp8, fp8=None), fp8_executor=None,
                         transformer_engine=False)  # the decision transformer_impl.py made is the language model's
    return build_layer_spec(vision, "dense", attn_mask_type=AttnMaskType.no_mask)


def build_llava_chunks(config: TransformerConfig, build: ModelBuild, choice: LayerChoice,
                       llava: LlavaBuild) -> list[LLaVAModel]:
    """One LLaVAModel per virtual pipeline stage held by this rank; the encoder only in the first chunk of the
    first stage."""
    lm_config = language_config(llava, config)
    lm_spec = build_layer_spec(choice, "dense")
    projector_spec = MLPSubmodules(linear_fc1=ColumnParallelLinear, linear_fc2=RowParallelLinear)
    chunks = []
    for vp_stage in range(config.virtual_pipeline_model_parallel_size or 1):
        vp = vp_stage if config.virtual_pipeline_model_parallel_size else None
        first = parallel_state.is_pipeline_first_stage(ignore_virtual=False, vp_stage=vp)
        last = parallel_state.is_pipeline_last_stage(ignore_virtual=False, vp_stage=vp)
        model = LLaVAModel(
            language_transformer_config=lm_config,
            language_transformer_layer_spec=lm_spec,
            language_vocab_size=build.padded_vocab_size,
            language_max_sequence_length=llava.decoder_seq_length,
            vision_transformer_config=vision_config(llava, config),
            vision_transformer_layer_spec=vision_layer_spec(choice),
            drop_vision_class_token=llava.disable_vision_class_token,
            vision_projection_config=projector_config(config),
            vision_projection_layer_spec=projector_spec,
            vision_projection_type="mlp",
            parallel_output=True,
            share_embeddings_and_output_weights=not build.untie_embeddings_and_output_weights,
            language_position_embedding_type=build.position_embedding_type,
            language_rotary_base=build.rotary_base,
            pre_process=first,
            post_process=last,
            add_encoder=first,
            add_decoder=True,
            img_h=llava.img_h,
            img_w=llava.img_w,
            patch_dim=llava.patch_dim,
            image_token_index=IMAGE_TOKEN_INDEX,
            pixel_shuffle=llava.pixel_shuffle,
            max_num_tiles=llava.max_num_tiles,
            vp_stage=vp,
        )
        model.model_type = ModelType.encoder_or_decoder  # the schedules read it (GPTModel sets it, LLaVAModel not)
        install_vocab_padding(model.language_model, build.vocab_size)  # embedding and/or output layer
        model.freeze(freeze_language_model=llava.freeze_LM, freeze_vision_model=llava.freeze_ViT,
                     freeze_vision_projection=llava.freeze_projection)
        chunks.append(model)
    return chunks
