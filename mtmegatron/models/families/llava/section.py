"""The LLaVA flags its model builder reads, as a typed section (utils/section.py): ``LlavaBuild`` holds the vision
tower's shape, the image geometry, the pipeline split of the language layers and the freeze flags
(models/families/llava/model.py). What the TransformerConfig carries (hidden size, layers, pipeline sizes) is
read from it, and the vocabulary and RoPE from models/section.py's ``ModelBuild``.
May assume: the flags were parsed and checked (models/families/llava/flags.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from mtmegatron.utils.section import Section


@dataclass(frozen=True)
class LlavaBuild(Section):
    vision_model_type: str                              # clip (QuickGELU) or siglip (tanh GeLU)
    vision_num_layers: int
    vision_hidden_size: int
    vision_ffn_hidden_size: int
    vision_num_attention_heads: int
    vision_norm_epsilon: float
    disable_vision_class_token: bool
    img_h: int
    img_w: int
    patch_dim: int
    pixel_shuffle: bool
    max_num_tiles: int
    decoder_seq_length: int | None                      # the language model's sequence length
    decoder_first_pipeline_num_layers: int | None       # the first stage (with the encoder) gets this many layers
    freeze_LM: bool                                     # --freeze-LM, --freeze-ViT (the dests keep the case)
    freeze_ViT: bool
    freeze_projection: bool
