"""Gemma 3's layers and model on megatron-core's own modules (``Family.model_builder`` of ``--model gemma3``).

What megatron-core's GPTModel / TransformerLayer lack, added here and nowhere else:
- four norms per layer: megatron's layer keeps its input and pre-MLP norms (HF's ``input_layernorm`` /
  ``pre_feedforward_layernorm``); ``Gemma3SelfAttention`` and ``Gemma3MLP`` normalise their own output
  (``post_layernorm``: HF's ``post_attention_layernorm`` / ``post_feedforward_layernorm``) before the residual add.
  All are ``ZeroCenteredNorm`` (``--apply-layernorm-1p``: ``rms_norm(x) * (1 + w)``, HF's Gemma3RMSNorm; HF computes
  in fp32 and casts back, the same in fp32 runs);
- two RoPE bases: GPTModel's rotary embedding is the global layers' (``--rotary-base``, linear scaling
  ``--rotary-seq-len-interpolation-factor``); a window layer rebuilds its angles with ``--rotary-base-local`` from
  the positions that embedding carries (its channel 0 is position x 1 / factor, so CP slices, packed sequences and
  the KV cache's offsets keep working unchanged);
- embeddings x sqrt(hidden) in the embedding's dtype (HF's Gemma3TextScaledWordEmbedding), a hook on GPTModel's
  embedding; GeGLU with tanh GeLU and the softmax scale ``1/sqrt(--query-pre-attn-scalar)`` set on the
  TransformerConfig before any module is built.
Built from the TransformerConfig and models/section.py's ``ModelBuild`` (vocabulary, RoPE, Gemma 3's local base and
softmax scalar), ``LayerChoice`` (the layer spec) and ``Fusions`` (the fused loss), as models/gpt.py builds the plain
decoder.
May assume: models/gpt.py's build context (parallel state up, backend active, birth device chosen); validated
flags (flags.py).
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from megatron.core import parallel_state
from megatron.core.models.gpt import GPTModel
from megatron.core.transformer.attention import SelfAttention
from megatron.core.transformer.mlp import MLP
from megatron.core.transformer.transformer_block import TransformerBlockSubmodules, get_num_layers_to_build
from megatron.core.transformer.utils import (ensure_metadata_has_dp_cp_group, is_layer_window_attention,
                                             make_sharded_tensors_for_checkpoint)

from mtmegatron.fp8.spec import keep_layers_in_bf16
from mtmegatron.models import fusions
from mtmegatron.models.layer_spec import build_layer_spec, choose_modules
from mtmegatron.models.section import Fusions, LayerChoice, ModelBuild
from mtmegatron.models.vocab import install_vocab_padding
from mtmegatron.models.zero_centered_norm import ZeroCenteredNorm
from mtmegatron.utils.errors import ConfigError


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    """HF's ``gelu_pytorch_tanh``."""
    return F.gelu(x, approximate="tanh")


def local_rotary(emb: torch.Tensor, base: float, position_scale: float) -> torch.Tensor:
    """The ``[s, 1, 1, dim]`` non-interleaved RoPE angles of base ``base`` at the positions of ``emb`` (megatron's
    angles, whose channel 0 is position / ``position_scale``)."""
    dim = emb.shape[-1]
    positions = torch.round(emb[..., :1].float() * position_scale)
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32, device=emb.device) / dim))
    freqs = positions * inv_freq
    return torch.cat((freqs, freqs), dim=-1).to(emb.dtype)


class PostNorm(ZeroCenteredNorm):
    """The ``(1 + w)`` RMSNorm on a sublayer's output, with the replicated checkpoint entries megatron gives a plain
    module (megatron's MLP asks each child for ``sharded_state_dict``)."""

    def sharded_state_dict(self, prefix="", sharded_offsets=(), metadata=None):
        metadata = ensure_metadata_has_dp_cp_group(metadata)
        tp_group = parallel_state.get_tensor_model_parallel_group()
        return make_sharded_tensors_for_checkpoint(self.state_dict(prefix="", keep_vars=True), prefix, {},
                                                   sharded_offsets, tp_group=tp_group,
                                                   dp_cp_group=metadata["dp_cp_group"])


def _post_norm(config):
    return PostNorm(config, hidden_size=config.hidden_size, eps=config.layernorm_epsilon)


class Gemma3SelfAttention(SelfAttention):
    """megatron's self-attention with its output normalised (``post_layernorm``) and, on a window layer, RoPE of
    the local base."""

    def __init__(self, config, submodules, layer_number, *args, local_rotary_base=None, position_scale=1,
                 **kwargs):
        super().__init__(config, submodules, layer_number, *args, **kwargs)
        self.post_layernorm = _post_norm(config)
        slides = is_layer_window_attention(config.window_size, config.window_attn_skip_freq, layer_number)
        self.local_rotary_base = local_rotary_base if slides else None
        self.position_scale = position_scale

    def forward(self, hidden_states, *args, rotary_pos_emb=None, **kwargs):
        if self.local_rotary_base is not None and rotary_pos_emb is not None:
            rotary_pos_emb = local_rotary(rotary_pos_emb, self.local_rotary_base, self.position_scale)
        output, bias = super().forward(hidden_states, *args, rotary_pos_emb=rotary_pos_emb, **kwargs)
        return self.post_layernorm(output), bias


class Gemma3MLP(MLP):
    """megatron's MLP with its output normalised (``post_layernorm``)."""

    def __init__(self, config, submodules, *args, **kwargs):
        super().__init__(config, submodules, *args, **kwargs)
        self.post_layernorm = _post_norm(config)

    def forward(self, hidden_states, *args, **kwargs):
        output, bias = super().forward(hidden_states, *args, **kwargs)
        return self.post_layernorm(output), bias


def _scale_embeddings(module, inputs, output):
    scale = torch.tensor(module.config.hidden_size ** 0.5, dtype=module.word_embeddings.weight.dtype)
    return output * scale.to(device=output.device, dtype=output.dtype)


class Gemma3Model(GPTModel):
    """GPTModel whose embeddings are scaled by sqrt(hidden) (in the embedding's dtype, as HF)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.pre_process:
            self.embedding.register_forward_hook(_scale_embeddings)


def gemma3_layer_spec(build: ModelBuild, choice: LayerChoice):
    """The layer spec of the run's modules (layer_spec.py) with Gemma 3's attention and MLP."""
    if choose_modules(choice).transformer_engine:
        raise ConfigError("--model gemma3: TransformerEngine layers fuse the norms Gemma 3 keeps apart; use "
                          "--transformer-impl local or mtmegatron")
    spec = build_layer_spec(choice, "dense")
    sub = spec.submodules
    attention = dataclasses.replace(sub.self_attention, module=Gemma3SelfAttention, params={
        **sub.self_attention.params, "local_rotary_base": build.rotary_base_local,
        "position_scale": build.rotary_seq_len_interpolation_factor or 1})
    mlp = dataclasses.replace(sub.mlp, module=Gemma3MLP, params=dict(sub.mlp.params))
    return dataclasses.replace(spec, submodules=dataclasses.replace(sub, self_attention=attention, mlp=mlp))


def configure(config, build: ModelBuild) -> None:
    """GeGLU with tanh GeLU and the softmax scale, on the config the modules are built from."""
    config.gated_linear_unit = True
    config.activation_func = gelu_tanh
    config.bias_activation_fusion = False
    config.softmax_scale = (build.query_pre_attn_scalar or config.kv_channels) ** -0.5


def _block(spec, config, vp_stage) -> TransformerBlockSubmodules:
    """The stage's layers and the ``(1 + w)`` final norm."""
    return TransformerBlockSubmodules(layer_specs=[spec] * get_num_layers_to_build(config, vp_stage=vp_stage),
                                      layer_norm=ZeroCenteredNorm)


def build_gemma3_chunks(config, build: ModelBuild, choice: LayerChoice, fusion_flags: Fusions) -> list[Gemma3Model]:
    """One Gemma3Model per virtual pipeline stage (models/gpt.py's loop for the plain decoder; its RoPE arguments
    as models/gpt.gpt_model_kwargs passes them, Llama-3 scaling refused by flags.py)."""
    configure(config, build)
    spec = gemma3_layer_spec(build, choice)
    fused = fusions.uses_our_cross_entropy(fusion_flags)
    if fused:
        from mtmegatron.models.fused_spec import install_fused_loss
    chunks = []
    for vp_stage in range(config.virtual_pipeline_model_parallel_size or 1):
        vp = vp_stage if config.virtual_pipeline_model_parallel_size else None
        chunk = Gemma3Model(
            config=config, transformer_layer_spec=_block(spec, config, vp),
            vocab_size=build.padded_vocab_size, max_sequence_length=build.max_position_embeddings,
            pre_process=parallel_state.is_pipeline_first_stage(ignore_virtual=False, vp_stage=vp),
            post_process=parallel_state.is_pipeline_last_stage(ignore_virtual=False, vp_stage=vp),
            share_embeddings_and_output_weights=not build.untie_embeddings_and_output_weights,
            position_embedding_type="rope", rotary_percent=build.rotary_percent, rotary_base=build.rotary_base,
            seq_len_interpolation_factor=build.rotary_seq_len_interpolation_factor,
            fp16_lm_cross_entropy=build.fp16_lm_cross_entropy, vp_stage=vp)
        install_vocab_padding(chunk, build.vocab_size)
        if fused:
            install_fused_loss(chunk)
        keep_layers_in_bf16(chunk, choice.fp8, config.num_layers)
        chunks.append(chunk)
    return chunks
