"""Builds the native-resolution vision-language model (Qwen2-VL / Qwen2.5-VL) from pretrain flags: the packed
vision encoder of models/families/qwen2_vl/vision_tower.py on the first pipeline stage, megatron-core's ``GPTModel`` with M-RoPE
(``position_embedding_type='mrope'``, ``mrope_section``) as the language model.

``NativeResolutionVLM.forward(input_ids, position_ids, attention_mask, labels=None, pixel_values=None,
image_grid_thw=None, pixel_values_videos=None, video_grid_thw=None, ...)``: the inputs HF's processors and
``get_rope_index`` give (``pixel_values`` ``[patches, C*T*P*P]``, ``image_grid_thw`` ``[images, 3]``, the same for
videos, ``position_ids`` ``[3, b, s]``; a 2-D ``[b, s]`` is text-only positions, the same on the three axes). The
merged image (video) embeddings replace the token embeddings at the ``image_token_id`` (``video_token_id``)
positions in batch-major order (as HF's ``masked_scatter``); the rest is ``GPTModel``'s forward (logits, or the
per-token loss with ``labels``).
The vision fields come from the preset or their flags (models/families/qwen2_vl/flags.py: ``vision_*`` dests,
``patch_dim``, ``image_token_id``, ``video_token_id``; a converted checkpoint's flags name every one):
the encoder layers are ``layer_spec.build_layer_spec``'s with the vision shape (LayerNorm + QuickGELU, or RMSNorm +
SwiGLU with biases) and mtmegatron's SDPA core attention whatever the language model runs (it takes packed
sequences).
Sequence parallelism: the embeddings are merged on the whole sequence, then split over TP (megatron-core's
LLaVA does the same); the encoder itself runs unsplit (no SP, as megatron's LLaVA recipe).
Context parallelism: ``forward(..., cp_positions=index)`` (tasks/qwen_vl/step.py) embeds and merges the whole
sequence on every CP rank (each runs the encoder on the micro-batch's pictures), then keeps the rows ``index``.
Not yet: FP8.
The M-RoPE positions (videos' temporal ones included) are the caller's (``position_ids``).
May assume: validated flags with the vision fields of a ``vision_encoder == "packed"`` family preset, parallel state
initialised, backend bridge active.
"""

from __future__ import annotations

import argparse
import dataclasses

import torch
import torch.nn.functional as F
from megatron.core import parallel_state, tensor_parallel
from megatron.core.enums import ModelType
from megatron.core.models.backends import LocalSpecProvider
from megatron.core.models.gpt import GPTModel
from megatron.core.process_groups_config import ProcessGroupCollection
from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear
from megatron.core.transformer import TransformerConfig
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.mlp import MLPSubmodules
from megatron.core.transformer.module import MegatronModule

from mtmegatron.models.families.qwen2_vl.vision_tower import PackedVisionEncoder
from mtmegatron.models.families.shared.vision_encoder import encoder_side, quick_gelu
from mtmegatron.models.layer_spec import build_layer_spec
from mtmegatron.models.section import LayerChoice
from mtmegatron.models.vocab import install_vocab_padding


def vision_config(args: argparse.Namespace, config: TransformerConfig) -> TransformerConfig:
    heads = args.vision_num_attention_heads
    swiglu = bool(args.vision_swiglu)
    return encoder_side(
        config, num_layers=args.vision_num_layers, hidden_size=args.vision_hidden_size,
        ffn_hidden_size=args.vision_ffn_hidden_size, num_attention_heads=heads, num_query_groups=heads,
        kv_channels=args.vision_hidden_size // heads, normalization=args.vision_normalization,
        layernorm_epsilon=args.vision_norm_epsilon, gated_linear_unit=swiglu,
        activation_func=F.silu if swiglu else quick_gelu, add_bias_linear=True, add_qkv_bias=True,
        qk_layernorm=False, apply_rope_fusion=False, bias_activation_fusion=False, rotary_interleaved=False,
        mrope_section=None, multi_latent_attention=False)


def merger_config(args: argparse.Namespace, config: TransformerConfig) -> TransformerConfig:
    """The merger's MLP: Linear(hidden*m*m -> same), exact GELU, Linear(-> language hidden), with biases."""
    width = args.vision_hidden_size * args.vision_spatial_merge_size ** 2
    return encoder_side(config, num_layers=1, ffn_hidden_size=width, gated_linear_unit=False, activation_func=F.gelu,
                        add_bias_linear=True, bias_activation_fusion=False)


def vision_layer_spec(choice: LayerChoice, normalization: str):
    """The encoder layer: bidirectional, packed (THD) SDPA attention, the vision norm (``--vision-normalization``),
    plain local linears."""
    layers = dataclasses.replace(choice.layers, normalization=normalization, qk_layernorm=False,
                                 multi_latent_attention=False, num_experts=None, transformer_impl="local",
                                 attention_backend="auto", layernorm_zero_centered_gamma=False)
    vision = LayerChoice(layers=layers, fp8=dataclasses.replace(choice.fp8, fp8=None), fp8_executor=None,
                         transformer_engine=False)
    return build_layer_spec(vision, "dense", attn_mask_type=AttnMaskType.no_mask)


def build_vision_encoder(args: argparse.Namespace, config: TransformerConfig,
                         choice: LayerChoice) -> PackedVisionEncoder:
    patch = args.patch_dim
    return PackedVisionEncoder(
        vision_config(args, config), vision_layer_spec(choice, args.vision_normalization),
        LocalSpecProvider().layer_norm(rms_norm=args.vision_normalization == "RMSNorm"),
        merger_config(args, config), MLPSubmodules(linear_fc1=ColumnParallelLinear, linear_fc2=RowParallelLinear),
        patch_input_size=3 * args.vision_temporal_patch_size * patch * patch, merge=args.vision_spatial_merge_size,
        window=args.vision_window_size // (args.vision_spatial_merge_size * patch) if args.vision_window_size else None,
        full_attention_layers=tuple(args.vision_full_attention_layers or ()), pg_collection=vision_process_groups())


def vision_process_groups() -> ProcessGroupCollection | None:
    """Under CP: megatron-core's groups with a one-rank CP group, since every CP rank runs the encoder on all the
    micro-batch's pictures (its packed THD RoPE and attention must not cut them over CP); else None (the defaults)."""
    if parallel_state.get_context_parallel_world_size() == 1:
        return None
    groups = ProcessGroupCollection.use_mpu_process_groups()
    rank = torch.distributed.get_rank()  # only this rank takes part: no other rank has to create it
    groups.cp = torch.distributed.new_group([rank], use_local_synchronization=True)
    return groups


class NativeResolutionVLM(MegatronModule):
    """The packed vision encoder (first stage only) feeding a GPTModel with M-RoPE (module docstring)."""

    def __init__(self, config: TransformerConfig, language_model: GPTModel, vision_model: PackedVisionEncoder | None,
                 image_token_id: int, video_token_id: int):
        super().__init__(config=config)
        self.language_model, self.vision_model = language_model, vision_model
        self.image_token_id, self.video_token_id = image_token_id, video_token_id
        self.pre_process, self.post_process = language_model.pre_process, language_model.post_process
        self.vocab_size = language_model.vocab_size  # the inference engine's logits width
        self.add_encoder = vision_model is not None
        self.share_embeddings_and_output_weights = language_model.share_embeddings_and_output_weights
        # under CP the caller gives each rank its positions (a THD row's whole: megatron-core's THD RoPE cuts it per
        # sequence), so M-RoPE must not cut them again as one sequence
        language_model.rotary_pos_emb.cp_group = None

    @property
    def decoder(self):
        """The language model's decoder (megatron-core's inference engine looks for one on the model)."""
        return self.language_model.decoder

    def shared_embedding_or_output_weight(self):
        return self.language_model.shared_embedding_or_output_weight()

    def set_input_tensor(self, input_tensor) -> None:
        self.language_model.set_input_tensor(input_tensor)

    def embed(self, input_ids: torch.Tensor, pixel_values=None, image_grid_thw=None, pixel_values_videos=None,
              video_grid_thw=None) -> torch.Tensor:
        """[s, b, h] token embeddings with the merged image (video) embeddings at the image (video) token
        positions. Images and videos go through the encoder as one packed sequence (each slab attends to itself)."""
        embeddings = self.language_model.embedding(input_ids=input_ids, position_ids=None)
        parts = [(p, g, t) for p, g, t in ((pixel_values, image_grid_thw, self.image_token_id),
                                           (pixel_values_videos, video_grid_thw, self.video_token_id)) if p is not None]
        if not parts:
            return embeddings + self._zero_from_encoder()
        merged = self.vision_model(torch.cat([p for p, _, _ in parts]), torch.cat([g for _, g, _ in parts]))
        counts = [int(g.prod(-1).sum()) // self.vision_model.merge ** 2 for _, g, _ in parts]
        batch_major = embeddings.transpose(0, 1)
        for (_, grid_thw, token), vision in zip(parts, merged.split(counts)):
            where = input_ids == token
            if int(where.sum()) != vision.shape[0]:
                raise ValueError(f"{int(where.sum())} tokens {token} in input_ids but the pixels give "
                                 f"{vision.shape[0]} embeddings (grid_thw {grid_thw.tolist()})")
            batch_major = batch_major.masked_scatter(where.unsqueeze(-1), vision.to(embeddings.dtype))
        return batch_major.transpose(0, 1).contiguous()

    def _zero_from_encoder(self):
        """0, through every encoder parameter: a micro-batch without pixels still gives them a (zero) gradient, so
        megatron-core's DDP sees every gradient it waits for (``--overlap-grad-reduce`` asserts otherwise)."""
        if self.vision_model is None or not torch.is_grad_enabled():
            return 0.0
        used = [p.reshape(-1)[:1] for p in self.vision_model.parameters() if p.requires_grad]
        return 0.0 * torch.cat(used).sum() if used else 0.0

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, attention_mask=None, labels=None,
                pixel_values: torch.Tensor | None = None, image_grid_thw: torch.Tensor | None = None,
                pixel_values_videos: torch.Tensor | None = None, video_grid_thw: torch.Tensor | None = None,
                **kwargs):
        if position_ids.dim() == 2:  # text only: one position per token, the same on the three M-RoPE axes
            position_ids = position_ids.unsqueeze(0).expand(3, -1, -1)
        decoder_input = kwargs.pop("decoder_input", None)  # given: embeddings already merged (tasks/qwen_vl/generate_*.py)
        cp_positions = kwargs.pop("cp_positions", None)  # CP: this rank's row positions (tasks/qwen_vl/step.py)
        if self.pre_process and decoder_input is None:
            decoder_input = self.embed(input_ids, pixel_values, image_grid_thw, pixel_values_videos, video_grid_thw)
            if cp_positions is not None:  # merged into the whole sequence, then this CP rank's part kept
                decoder_input = decoder_input.index_select(0, cp_positions)
            if self.config.sequence_parallel:  # merged on the whole sequence, then split (as megatron's LLaVA)
                decoder_input = tensor_parallel.scatter_to_sequence_parallel_region(decoder_input)
        return self.language_model(input_ids, position_ids, attention_mask, decoder_input=decoder_input,
                                   labels=labels, **kwargs)


def language_model_kwargs(args: argparse.Namespace) -> dict:
    return dict(position_embedding_type="mrope", rotary_percent=args.rotary_percent, rotary_base=args.rotary_base,
                seq_len_interpolation_factor=args.rotary_seq_len_interpolation_factor)


def freeze(model: NativeResolutionVLM, args: argparse.Namespace) -> None:
    """LLaVA's flags: ``--freeze-LM`` the language model, ``--freeze-ViT`` the patch embedding and the encoder
    layers, ``--freeze-projection`` the merger (its norm and MLP: the projector into the language model)."""
    frozen = [model.language_model] if args.freeze_LM else []
    if model.vision_model is not None:
        vision = model.vision_model
        frozen += [vision.patch_embed, vision.decoder] if args.freeze_ViT else []
        frozen += [vision.merger_norm, vision.merger] if args.freeze_projection else []
    for module in frozen:
        module.requires_grad_(False)


def build_qwen_vl_chunks(args: argparse.Namespace, config: TransformerConfig,
                         choice: LayerChoice) -> list[NativeResolutionVLM]:
    """One model per virtual pipeline stage held by this rank; the vision encoder only in the first chunk of the
    first stage (``--decoder-first/last-pipeline-num-layers`` give that stage fewer language layers: the flags'
    config carries the split)."""
    lm_config = dataclasses.replace(config, mrope_section=list(args.mrope_section))
    lm_spec = build_layer_spec(choice, "dense")
    chunks = []
    for vp_stage in range(args.virtual_pipeline_model_parallel_size or 1):
        vp = vp_stage if args.virtual_pipeline_model_parallel_size else None
        first = parallel_state.is_pipeline_first_stage(ignore_virtual=False, vp_stage=vp)
        last = parallel_state.is_pipeline_last_stage(ignore_virtual=False, vp_stage=vp)
        language = GPTModel(config=lm_config, transformer_layer_spec=lm_spec, vocab_size=args.padded_vocab_size,
                            max_sequence_length=args.max_position_embeddings, pre_process=first, post_process=last,
                            share_embeddings_and_output_weights=not args.untie_embeddings_and_output_weights,
                            scatter_embedding_sequence_parallel=False, **language_model_kwargs(args), vp_stage=vp)
        install_vocab_padding(language, args.vocab_size)
        vision = build_vision_encoder(args, config, choice) if first else None
        model = NativeResolutionVLM(lm_config, language, vision, args.image_token_id, args.video_token_id)
        model.model_type = ModelType.encoder_or_decoder  # the schedules read it
        freeze(model, args)
        chunks.append(model)
    return chunks
