"""Config fields and block specs beyond a uniform Llama/Mixtral stack: multi-latent attention (MLA), first-k
dense + MoE layers with their own FFN sizes, shared experts, the biased group-limited sigmoid router, and
multi-token prediction (MTP). Used for DeepSeek-V3, but every piece is switched by its own Megatron-LM flag.

Everything here is megatron-core 0.16's own: ``MLATransformerConfig``, the layer pattern from
``moe_layer_freq`` (dense layers build ``MLP`` with ``ffn_hidden_size``, routed experts ``moe_ffn_hidden_size``,
the shared expert ``moe_shared_expert_intermediate_size``), the MTP block layout of ``get_gpt_mtp_block_spec``;
every layer spec comes from ``models/layer_spec.build_layer_spec``, given the run's ``LayerChoice``
(models/section.py). The config fields these flags set (MoE routing extras, MTP, MLA) are filled with the rest of
the config from the flags (models/config_from_flags.py).
May assume: flags validated (config/arguments.py); parallel state initialised when a spec is built.
"""

from __future__ import annotations

from megatron.core.transformer.transformer_block import TransformerBlockSubmodules, get_num_layers_to_build
from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

from mtmegatron.models.moe_layers import moe_layer_pattern
from mtmegatron.models.section import LayerChoice, Layers


def needs_block_spec(layers: Layers) -> bool:
    """Whether a model with experts has dense layers too (then the stack is not one repeated layer)."""
    return bool(layers.num_experts) and 0 in moe_layer_pattern(layers.num_layers, layers.num_experts,
                                                               layers.moe_layer_freq)


def decoder_block_spec(config, choice: LayerChoice, vp_stage: int | None):
    """This pipeline stage's slice of the dense/MoE layer pattern, each layer from ``build_layer_spec``."""
    from megatron.core.transformer.transformer_block import LayerNormImpl  # what a uniform stack gets

    from mtmegatron.models.layer_spec import build_layer_spec

    offset = get_transformer_layer_offset(config, vp_stage=vp_stage)
    count = get_num_layers_to_build(config, vp_stage=vp_stage)
    layers = choice.layers
    kinds = moe_layer_pattern(layers.num_layers, layers.num_experts, layers.moe_layer_freq)[offset:offset + count]
    return TransformerBlockSubmodules(layer_specs=[build_layer_spec(choice, "moe" if kind else "dense")
                                                   for kind in kinds], layer_norm=LayerNormImpl)


def mtp_block_spec(config, choice: LayerChoice, vp_stage: int | None):
    """The MTP block on the stage that holds it (megatron-core puts every MTP layer on the last pipeline stage);
    None elsewhere or without ``--mtp-num-layers``. Each layer is ``build_layer_spec(choice, "mtp")``."""
    if not config.mtp_num_layers:
        return None
    from megatron.core.transformer.multi_token_prediction import (MultiTokenPredictionBlockSubmodules,
                                                                  get_mtp_num_layers_to_build)

    from mtmegatron.models.layer_spec import build_layer_spec

    count = get_mtp_num_layers_to_build(config, vp_stage=vp_stage)
    if count == 0:
        return None
    assert count == config.mtp_num_layers, "megatron-core builds all MTP layers on one pipeline stage"
    return MultiTokenPredictionBlockSubmodules(layer_specs=[build_layer_spec(choice, "mtp") for _ in range(count)])
