"""What the Qwen2-VL / Qwen2.5-VL HF config and map read beside megatron-core's ``TransformerConfig`` and
models/section.py's ``ModelBuild``, as a typed section (utils/section.py): the vision tower's flags and the
special token ids (models/families/qwen2_vl/flags.py declares them all).
May assume: the flags were parsed and checked (models/families/qwen2_vl/flags.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from mtmegatron.utils.section import Section


@dataclass(frozen=True)
class QwenVlHf(Section):
    vision_num_layers: int
    vision_hidden_size: int
    vision_ffn_hidden_size: int
    vision_num_attention_heads: int
    vision_norm_epsilon: float
    vision_spatial_merge_size: int
    vision_temporal_patch_size: int
    vision_window_size: int | None                      # Qwen2.5-VL's window attention
    vision_full_attention_layers: list | None
    vision_tokens_per_second: float | None
    patch_dim: int
    image_token_id: int                                 # qwen2_vl.TOKEN_FIELDS
    video_token_id: int
    vision_start_token_id: int
    vision_end_token_id: int
