"""The config pieces of a vision tower (and its projector) that the vision-language families (LLaVA, Qwen2-VL /
Qwen2.5-VL) share: the first-stage-only ``TransformerConfig`` and CLIP's activation.
May assume: megatron-core 0.16.
"""

from __future__ import annotations

import dataclasses

import torch
from megatron.core.transformer import TransformerConfig


def encoder_side(config: TransformerConfig, **fields) -> TransformerConfig:
    """A config for a module that lives whole on the first pipeline stage: no PP/VPP/CP, no SP (megatron-core's
    LLaVA recipe), no recompute, same TP and dtypes as the language model."""
    return dataclasses.replace(
        config, pipeline_model_parallel_size=1, virtual_pipeline_model_parallel_size=None,
        num_layers_in_first_pipeline_stage=None, num_layers_in_last_pipeline_stage=None, context_parallel_size=1,
        sequence_parallel=False, recompute_granularity=None, recompute_method=None, recompute_num_layers=None,
        num_moe_experts=None, mtp_num_layers=None, **fields)


def quick_gelu(x: torch.Tensor) -> torch.Tensor:
    """CLIP's activation. megatron-core's ``activations.quick_gelu`` is wrapped in its ``jit_fuser``
    (torch.compile), which the CPU bridge's device properties and MUSA's disabled dynamo cannot run."""
    return x * torch.sigmoid(1.702 * x)
