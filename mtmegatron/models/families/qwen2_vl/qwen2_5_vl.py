"""Qwen2.5-VL (``--model qwen2.5-vl``; HF ``Qwen2_5_VLForConditionalGeneration``): Qwen2-VL's model (qwen2_vl/__init__.py)
with a vision tower of RMSNorm + SwiGLU layers (biases on gate/up/down), windowed attention (``window_size``
pixels a side) in every layer but the full-attention ones (``fullatt_block_indexes``), and an RMSNorm before the
merger. Built by models/families/qwen2_vl/model.py (``vision_encoder="packed"``).
Map: as qwen2_vl/__init__.py, with ``gate_proj``/``up_proj`` -> ``linear_fc1`` (rows and biases concatenated),
``down_proj`` -> ``linear_fc2``, weight-only norms. HF config -> flags as qwen2_vl/__init__.py, the tower's from
``depth``, ``hidden_size``, ``intermediate_size``, ``num_heads``, ``patch_size``, ``temporal_patch_size``,
``spatial_merge_size``, ``window_size``, ``fullatt_block_indexes`` and ``tokens_per_second`` (video time positions:
``--vision-tokens-per-second``; transformers' default 4 where absent, the released configs say 2), all written back
on export; ``out_hidden_size`` must be the language width.
May assume: what qwen2_vl/__init__.py assumes.
"""

from __future__ import annotations

import mtmegatron.models.families.gpt as gpt
import mtmegatron.models.families.qwen2_vl as qwen2_vl
from mtmegatron.models.families.base import Entry, Family

VIT = {**qwen2_vl.PATCHES, "vision_normalization": "RMSNorm", "vision_swiglu": True, "vision_tokens_per_second": 2}
VIT_RELEASED = {**VIT, "vision_num_layers": 32, "vision_hidden_size": 1280, "vision_ffn_hidden_size": 3420,
                "vision_num_attention_heads": 16, "vision_window_size": 112,
                "vision_full_attention_layers": [7, 15, 23, 31]}
RELEASED_TEXT = {**qwen2_vl.RELEASED_TEXT, "max_position_embeddings": 128000}

PRESETS = {
    # qwen2-vl's tiny language model; a 2-layer ViT: layer 0 in windows of 2x2 merge blocks, layer 1 full
    "tiny": {**qwen2_vl.PRESETS["tiny"], **VIT, "vision_num_layers": 2, "vision_hidden_size": 64,
             "vision_ffn_hidden_size": 96, "vision_num_attention_heads": 4, "vision_window_size": 56,
             "vision_full_attention_layers": [1]},
    # Qwen/Qwen2.5-VL-3B-Instruct
    "3b": dict(qwen2_vl.TEXT_COMMON, **RELEASED_TEXT, **qwen2_vl.RELEASED_TOKENS, **VIT_RELEASED, num_layers=36,
               hidden_size=2048, ffn_hidden_size=11008, num_attention_heads=16, num_query_groups=2,
               vocab_size=151936, untie_embeddings_and_output_weights=False),
    # Qwen/Qwen2.5-VL-7B-Instruct
    "7b": dict(qwen2_vl.TEXT_COMMON, **RELEASED_TEXT, **qwen2_vl.RELEASED_TOKENS, **VIT_RELEASED, num_layers=28,
               hidden_size=3584, ffn_hidden_size=18944, num_attention_heads=28, num_query_groups=4,
               vocab_size=152064),
}


VISION_DEFAULTS = {"depth": 32, "hidden_size": 3584, "intermediate_size": 3420, "num_heads": 16, "in_channels": 3,
                   "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2, "hidden_act": "silu",
                   "window_size": 112, "out_hidden_size": 3584, "fullatt_block_indexes": [7, 15, 23, 31],
                   "tokens_per_second": 4}  # transformers' Qwen2_5_VLVisionConfig (the released configs say 2)


def flags_from_hf(config: dict, **_) -> list[str]:
    vision = qwen2_vl.vision_section(config, VISION_DEFAULTS, "silu")
    shape = {dest: qwen2_vl.integer(f"vision_config.{field}", vision[field]) for dest, field in (
        ("vision_num_layers", "depth"), ("vision_hidden_size", "hidden_size"),
        ("vision_ffn_hidden_size", "intermediate_size"), ("vision_num_attention_heads", "num_heads"),
        ("patch_dim", "patch_size"), ("vision_temporal_patch_size", "temporal_patch_size"),
        ("vision_spatial_merge_size", "spatial_merge_size"), ("vision_window_size", "window_size"),
        ("vision_tokens_per_second", "tokens_per_second"))}
    indexes = vision["fullatt_block_indexes"]
    if not isinstance(indexes, (list, tuple)):
        qwen2_vl.fail(f"vision_config.fullatt_block_indexes {indexes!r}: a list of layer indexes is expected; "
                      f"not converted")
    shape["vision_full_attention_layers"] = [qwen2_vl.integer("vision_config.fullatt_block_indexes", i, minimum=0)
                                             for i in indexes]
    block = shape["patch_dim"] * shape["vision_spatial_merge_size"]
    if shape["vision_window_size"] < block:
        qwen2_vl.fail(f"vision_config.window_size {shape['vision_window_size']}: less than one {block}x{block} merge "
                      f"block (patch_size x spatial_merge_size pixels); not converted")
    return qwen2_vl.vl_flags(FAMILY, config, shape, "out_hidden_size", vision["out_hidden_size"])


def hf_config(config, build, record: dict | None = None, section=None, **_) -> dict:
    vision = {**qwen2_vl.vision_shape(section, "hidden_size", "num_heads"), "out_hidden_size": config.hidden_size,
              "intermediate_size": section.vision_ffn_hidden_size, "hidden_act": "silu",
              "window_size": section.vision_window_size,
              "fullatt_block_indexes": list(section.vision_full_attention_layers or []),
              "tokens_per_second": section.vision_tokens_per_second}
    return qwen2_vl.vl_config(FAMILY, config, build, section, vision, record)


def _swiglu_mlp(m: str, h: str) -> list[Entry]:
    out = []
    for kind in ("weight", "bias"):
        out += [gpt.gate_up(f"{m}mlp.linear_fc1.{kind}", f"{h}mlp.gate_proj.{kind}", f"{h}mlp.up_proj.{kind}"),
                gpt.same(f"{m}mlp.linear_fc2.{kind}", f"{h}mlp.down_proj.{kind}")]
    return out


def hf_map(config, build, section=None, **_) -> list[Entry]:
    return qwen2_vl.language_map(config, build) + qwen2_vl.vision_map(section, _swiglu_mlp, ("weight",))


FAMILY = Family(name="qwen2.5-vl", presets=PRESETS, hf_model_type="qwen2_5_vl",
                hf_architecture="Qwen2_5_VLForConditionalGeneration", flags_from_hf=flags_from_hf, hf_config=hf_config,
                hf_map=hf_map, hf_section=qwen2_vl.QwenVlHf,
                vision_encoder="packed", task="qwen_vl")
