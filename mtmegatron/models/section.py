"""The values the model build reads beside megatron-core's ``TransformerConfig``, as typed sections (utils/section.py).

``ModelBuild``: the family, the vocabulary
(``padded_vocab_size`` rows, ``vocab_size`` real), the position embedding and its RoPE variants (GPTModel's
arguments, Llama-3 scaling, YaRN on a plain attention), and whether input and output embeddings are tied.
None of these is a ``TransformerConfig`` field (megatron-core's GPTModel takes them as arguments, and YaRN's values
live only on ``MLATransformerConfig``); what the config carries (hidden size, heads, layers, virtual pipeline
stages, MLA) is read from the config. Filled once per build by models/gpt.py (``ModelBuild.of(args)``).
``Fusions``: the fusion flags and the values that decide where each applies (models/fusions.py), read when the
config is filled and by the start-up line.
May assume: the flags were parsed and checked (config/, the families' flags.py).
"""

from __future__ import annotations

from dataclasses import dataclass

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
