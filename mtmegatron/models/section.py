"""The values the model build reads beside megatron-core's ``TransformerConfig``, as typed sections (utils/section.py).

``ModelBuild``: the family, the vocabulary
(``padded_vocab_size`` rows, ``vocab_size`` real), the position embedding and its RoPE variants (GPTModel's
arguments, Llama-3 scaling, YaRN on a plain attention), and whether input and output embeddings are tied.
None of these is a ``TransformerConfig`` field (megatron-core's GPTModel takes them as arguments, and YaRN's values
live only on ``MLATransformerConfig``); what the config carries (hidden size, heads, layers, virtual pipeline
stages, MLA) is read from the config. Filled once per build by models/gpt.py (``ModelBuild.of(args)``).
``Fusions``: the fusion flags and the values that decide where each applies (models/fusions.py), read when the
config is filled and by the start-up line.
``Layers``: the flags the layer spec reads (models/layer_spec.py, models/deepseek.py's per-stage blocks).
``Initialization``: where the weights are born and whether a checkpoint fills them (models/initialization.py).
``AuxLosses``: which auxiliary losses the run's model has (models/aux_losses.py).
``LayerChoice`` (not a section: two of its values are decided after parsing, so they are no flag dests): the
``Layers`` and ``Fp8`` sections with whether the layers are TransformerEngine's (config/transformer_impl.py, at
parse time) and the FP8 executor in use (fp8/spec.choose_executor, at start-up); models/gpt.py's
``layer_choice(args)`` fills it once, and every layer-spec builder takes it.
May assume: the flags were parsed and checked (config/, the families' flags.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from mtmegatron.fp8.section import Fp8
from mtmegatron.utils.section import Section


@dataclass(frozen=True)
class ModelBuild(Section):
    model: str | None                                   # --model: the family (None: a plain Megatron-LM GPT)
    padded_vocab_size: int                              # embedding/output rows (models/vocab.py pads them)
    vocab_size: int                                     # the real rows; the padding's logits are -inf
    max_position_embeddings: int
    untie_embeddings_and_output_weights: bool
    position_embedding_type: str                        # GPTModel's position-embedding arguments (Megatron-LM's
    rotary_percent: float                               # gpt_builders passes these flags)
    rotary_base: int | float
    rotary_seq_len_interpolation_factor: float | None
    fp16_lm_cross_entropy: bool
    use_rope_scaling: bool                              # Llama-3.x RoPE scaling and its values
    rope_scaling_factor: float
    rope_scaling_low_freq_factor: float
    rope_scaling_high_freq_factor: float
    rope_scaling_original_max_position_embeddings: int
    rope_type: str | None                               # YaRN on a plain attention (GPT-OSS: gpt_oss/rope.py)
    rotary_scaling_factor: float
    original_max_position_embeddings: int
    beta_fast: float
    beta_slow: float
    mscale: float
    mscale_all_dim: float
    rotary_base_local: int | float | None               # Gemma 3: its window layers' RoPE base and softmax scalar
    query_pre_attn_scalar: float | None                 # (families/gemma3/model.py)


@dataclass(frozen=True)
class Fusions(Section):
    """The fusion flags (each on by Megatron-LM's default, ``--no-...`` turns it off; cross-entropy off unless
    ``--cross-entropy-loss-fusion``) and the model values that decide which apply (models/fusions.py)."""

    transformer_impl: str                               # mtmegatron: our fused RoPE and cross-entropy, MoE fusions
    bias_dropout_fusion: bool
    swiglu: bool                                        # which bias-activation flag applies
    bias_swiglu_fusion: bool
    bias_gelu_fusion: bool
    apply_rope_fusion: bool
    position_embedding_type: str                        # RoPE fusion: only for rope, and not under MLA
    multi_latent_attention: bool
    masked_softmax_fusion: bool
    no_persist_layer_norm: bool
    gradient_accumulation_fusion: bool
    cross_entropy_loss_fusion: bool
    num_experts: int | None                             # MoE permute/router fusions (mtmegatron.ops)


@dataclass(frozen=True)
class Layers(Section):
    """What decides the modules of a layer (models/layer_spec.py) and which layers are MoE (models/deepseek.py)."""

    transformer_impl: str                               # local, mtmegatron, transformer_engine (as resolved)
    attention_backend: str                              # attention/spec.core_attention_choice
    normalization: str
    layernorm_zero_centered_gamma: bool                 # --apply-layernorm-1p
    multi_latent_attention: bool
    qk_layernorm: bool
    num_layers: int
    num_experts: int | None
    moe_layer_freq: int | list                          # models/moe_layers.moe_layer_pattern
    moe_grouped_gemm: bool
    moe_use_legacy_grouped_gemm: bool


@dataclass(frozen=True)
class LayerChoice:
    """The layer spec's inputs: the flags, and the two decisions made after parsing (see the module docstring)."""

    layers: Layers
    fp8: Fp8
    transformer_engine: bool                            # the layers are TransformerEngine's
    fp8_executor: str | None                            # the FP8 executor in use; None without FP8


@dataclass(frozen=True)
class Initialization(Section):
    """Where the weights are born and whether they are filled (models/initialization.py)."""

    use_cpu_initialization: bool | None
    init_model_with_meta_device: bool
    load: str | None                                    # a checkpoint about to be loaded skips the fill
    moe_use_upcycling: bool                             # ... except when upcycling a dense one (no router)


@dataclass(frozen=True)
class AuxLosses(Section):
    """Which MTP and MoE auxiliary losses the model has, and its layer pattern (models/aux_losses.py)."""

    mtp_num_layers: int | None
    num_experts: int | None
    moe_router_load_balancing_type: str | list
    moe_aux_loss_coeff: float | list
    moe_z_loss_coeff: float | None
    num_layers: int
    moe_layer_freq: int | list
