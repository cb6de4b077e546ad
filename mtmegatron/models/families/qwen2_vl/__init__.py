"""Qwen2-VL (``--model qwen2-vl``; HF ``Qwen2VLForConditionalGeneration``): a native-resolution ViT (Conv3d patches
14 x 14 x 2 frames, LayerNorm + QuickGELU layers, 2-D rotary positions, a 2x2 patch merger) and the Qwen2 language
model (the qwen2.5 family's layer: biases on q/k/v) with M-RoPE (``mrope_section``). Built by models/families/qwen2_vl/model.py
(``vision_encoder="packed"``).

Preset fields beyond the language model's (dests read by models/families/qwen2_vl/model.py; flags: models/families/qwen2_vl/flags.py):
``vision_num_layers``, ``vision_hidden_size``, ``vision_ffn_hidden_size``, ``vision_num_attention_heads``,
``vision_norm_epsilon``, ``patch_dim``, ``vision_temporal_patch_size``, ``vision_spatial_merge_size``,
``vision_window_size`` / ``vision_full_attention_layers`` / ``vision_tokens_per_second`` (Qwen2.5-VL's; None here),
the special token ids (``image_token_id`` / ``video_token_id`` the model reads, all four the data checks), and
``vision_normalization`` / ``vision_swiglu`` (the family's, no flags).
HF map (the names on disk: the released checkpoints' and what transformers 5's ``save_pretrained`` writes; in
memory transformers 5 names them ``model.language_model.*`` / ``model.visual.*``): ``model.*`` / ``lm_head`` ->
``language_model.*`` as the qwen2.5 decoder; ``visual.*`` -> ``vision_model.*``: the Conv3d kernel flattened into
``patch_embed`` (a Linear), each block's fused ``qkv`` (all q, then all k, then all v) regrouped per head,
``norm1/norm2`` -> the layer norms, the merger's ``ln_q`` -> ``merger_norm`` and ``mlp.0/mlp.2`` ->
``merger.encoder.linear_fc1/fc2``.
HF config -> flags, every value explicit (no preset value leaks in): the language model's flags from
``text_config`` (or the flat fields of older config.json files, ``rope_scaling`` ``{"type": "mrope",
"mrope_section": ...}``), the vision tower's from ``vision_config`` (``depth``, ``embed_dim``, ``mlp_ratio``,
``num_heads``, ``patch_size``, ``temporal_patch_size``, ``spatial_merge_size``; transformers' defaults where absent)
and the four special token ids. Refused, one line naming the field: another ``hidden_act``, ``in_channels`` or
vision rotary base, a merger output (``vision_config.hidden_size``) other than the language width, a head dim that
is not a multiple of 4, a field that is not an integer. ``bos_token_id`` / ``eos_token_id`` / ``pad_token_id``
(the model never reads them) are recorded by convert (``carried_text_fields``) and written back into
``text_config`` on export (``hf_config(config, build, record=...)``); not read by transformers: ``initializer_range``, the
older ``spatial_patch_size``.
Not yet: checkpoint fingerprints (a training checkpoint names its ``--model``; its vision fields are not in the
fingerprint).
May assume: what gpt.py assumes.
"""

from __future__ import annotations

import torch

import mtmegatron.models.families.gpt as gpt
from mtmegatron.models.families.base import ConversionError, Entry, Family
from mtmegatron.models.families.qwen2_vl.section import QwenVlHf

TEXT_COMMON = dict(gpt.LLAMA_COMMON, layernorm_epsilon=1e-6, rotary_base=1000000, add_qkv_bias=True,
                   position_embedding_type="mrope")
RELEASED_TEXT = dict(seq_length=4096, max_position_embeddings=32768, mrope_section=[16, 24, 24])
RELEASED_TOKENS = dict(image_token_id=151655, video_token_id=151656, vision_start_token_id=151652,
                       vision_end_token_id=151653)
# a tiny vocabulary's last ids stand for the special tokens
TINY_TOKENS = dict(image_token_id=1020, video_token_id=1021, vision_start_token_id=1018, vision_end_token_id=1019)
PATCHES = dict(patch_dim=14, vision_temporal_patch_size=2, vision_spatial_merge_size=2, vision_norm_epsilon=1e-6,
               vision_window_size=None, vision_full_attention_layers=None, vision_tokens_per_second=None)
VIT = dict(PATCHES, vision_normalization="LayerNorm", vision_swiglu=False)
VIT_RELEASED = dict(VIT, vision_num_layers=32, vision_hidden_size=1280, vision_ffn_hidden_size=5120,
                    vision_num_attention_heads=16)

PRESETS = {
    # a 4-layer language model (head dim 16: M-RoPE sections 2+3+3), a 2-layer ViT of width 64
    "tiny": dict(TEXT_COMMON, **gpt.TINY_DENSE, mrope_section=[2, 3, 3], **TINY_TOKENS, **VIT, vision_num_layers=2,
                 vision_hidden_size=64, vision_ffn_hidden_size=256, vision_num_attention_heads=4),
    # Qwen/Qwen2-VL-2B-Instruct
    "2b": dict(TEXT_COMMON, **RELEASED_TEXT, **RELEASED_TOKENS, **VIT_RELEASED, num_layers=28, hidden_size=1536,
               ffn_hidden_size=8960, num_attention_heads=12, num_query_groups=2, vocab_size=151936,
               untie_embeddings_and_output_weights=False),
    # Qwen/Qwen2-VL-7B-Instruct
    "7b": dict(TEXT_COMMON, **RELEASED_TEXT, **RELEASED_TOKENS, **VIT_RELEASED, num_layers=28, hidden_size=3584,
               ffn_hidden_size=18944, num_attention_heads=28, num_query_groups=4, vocab_size=152064),
}
TOKEN_FIELDS = ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id")


def fail(message: str) -> None:
    raise ConversionError(message)


# ---- HF config.json -> flags ----------------------------------------------------------------------------------
VISION_DEFAULTS = {"depth": 32, "embed_dim": 1280, "mlp_ratio": 4, "num_heads": 16, "in_channels": 3,
                   "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2, "hidden_act": "quick_gelu",
                   "hidden_size": 3584}  # transformers' Qwen2VLVisionConfig
TOKEN_DEFAULTS = dict(RELEASED_TOKENS)  # Qwen2VLConfig's
# text config fields that do not change the model but belong to the checkpoint: recorded at conversion
# (``hf_layout``), written back on export
CARRIED_TEXT_FIELDS = ("bos_token_id", "eos_token_id", "pad_token_id")


def text_section(config: dict) -> dict:
    """The language model's fields of a Qwen VL config.json: the nested ``text_config`` over the top level (the
    older flat layout)."""
    text = {k: v for k, v in config.items() if k not in ("vision_config", "text_config")}
    text.update(config.get("text_config") or {})
    return text


def text_flags(config: dict) -> list[str]:
    """The Qwen2 decoder with M-RoPE of a Qwen VL config.json (nested text_config or the older flat layout)."""
    text = text_section(config)
    rope = dict(text.pop("rope_parameters", None) or text.pop("rope_scaling", None) or {})
    sections = rope.get("mrope_section", [16, 24, 24])
    theta = rope.get("rope_theta", text.get("rope_theta", 1000000.0))
    if rope.get("rope_type", rope.get("type", "default")) not in ("default", "mrope"):
        fail(f"rope {rope}: only M-RoPE without scaling is supported; not converted")
    head_dim = text["hidden_size"] // text["num_attention_heads"]
    if 2 * sum(sections) != head_dim:
        fail(f"mrope_section {sections}: the sections must cover half the head dim {head_dim}; not converted")
    text.update(rope_parameters={"rope_type": "default", "rope_theta": theta}, head_dim=head_dim)
    text.setdefault("rms_norm_eps", 1e-5)  # Qwen2VLTextConfig's default
    text.setdefault("tie_word_embeddings", config.get("tie_word_embeddings", False))
    return [*gpt.llama_like_flags(text), "--add-qkv-bias", "--position-embedding-type", "mrope",
            "--mrope-section", *map(str, sections)]


def carried_text_fields(config: dict) -> dict:
    """The config's bos/eos/pad token ids (``CARRIED_TEXT_FIELDS``, where given): what convert records."""
    text = text_section(config)
    return {field: text[field] for field in CARRIED_TEXT_FIELDS if text.get(field) is not None}


def integer(field: str, value, minimum: int = 1) -> int:
    """``value`` of config field ``field`` as an int (an integral float too) of at least ``minimum``; a
    ConversionError naming the field if not."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value) or value < minimum:
        fail(f"{field} {value!r}: an integer >= {minimum} is expected here; not converted")
    return int(value)


def vision_section(config: dict, defaults: dict, activation: str) -> dict:
    """``vision_config`` over transformers' defaults, after the fields our tower cannot take are refused: another
    activation, channel count or rotary base (HF's 2-D rotary ``rope_parameters``)."""
    vision = {**defaults, **(config.get("vision_config") or {})}
    if vision["hidden_act"] != activation:
        fail(f"vision_config.hidden_act {vision['hidden_act']!r}: this tower is built with {activation} only; "
             f"not converted")
    channels = vision.get("in_chans", vision["in_channels"])  # the released configs' older name
    if channels != 3:
        fail(f"vision_config.in_channels {channels!r}: the tower takes RGB patches (3 channels) only; not converted")
    rope = vision.get("rope_parameters") or {}
    if rope.get("rope_type", "axial") not in ("axial", "default") or float(rope.get("rope_theta", 10000.0)) != 1e4:
        fail(f"vision_config.rope_parameters {rope}: the tower's 2-D rotary angles use base 10000 (axial) only; "
             f"not converted")
    return vision


def tower_flags(fields: dict) -> list[str]:
    """``{dest: value}`` of the tower (models/families/qwen2_vl/flags.py) as flags."""
    flags = []
    for dest, value in fields.items():
        flag = "--" + dest.replace("_", "-")
        flags += [flag, *map(str, value)] if isinstance(value, list) else [flag, str(value)]
    return flags


def vl_flags(family: Family, config: dict, vision_fields: dict, merger_field: str, merger_out) -> list[str]:
    """Every flag of a Qwen VL config.json: the language model's, the tower's (``vision_fields``: dest -> value,
    checked here against the config field it came from) and the special token ids; ``merger_field`` (the
    merger's output width, ``merger_out``) must be the language model's width."""
    flags = text_flags(config)
    hidden = int(flags[flags.index("--hidden-size") + 1])
    if integer(f"vision_config.{merger_field}", merger_out) != hidden:
        fail(f"vision_config.{merger_field} {merger_out} (the merger's output) != the language model's hidden_size "
             f"{hidden}; not converted")
    width, heads = vision_fields["vision_hidden_size"], vision_fields["vision_num_attention_heads"]
    if heads < 1 or width % heads or (width // heads) % 4:
        fail(f"vision_config width {width} / num_heads {heads}: the vision head dim must be a whole multiple of 4 "
             f"(its 2-D rotary angles); not converted")
    tokens = {f: integer(f, config.get(f, TOKEN_DEFAULTS[f]), minimum=0) for f in TOKEN_FIELDS}
    return ["--model", family.name, *flags, *tower_flags({**vision_fields, **tokens})]


def flags_from_hf(config: dict, **_) -> list[str]:
    vision = vision_section(config, VISION_DEFAULTS, "quick_gelu")
    shape = {dest: integer(f"vision_config.{field}", vision[field]) for dest, field in (
        ("vision_num_layers", "depth"), ("vision_hidden_size", "embed_dim"), ("vision_num_attention_heads", "num_heads"),
        ("patch_dim", "patch_size"), ("vision_temporal_patch_size", "temporal_patch_size"),
        ("vision_spatial_merge_size", "spatial_merge_size"))}
    shape["vision_ffn_hidden_size"] = shape["vision_hidden_size"] * integer("vision_config.mlp_ratio",
                                                                            vision["mlp_ratio"])
    return vl_flags(FAMILY, config, shape, "hidden_size", vision["hidden_size"])


# ---- flags -> HF config.json ----------------------------------------------------------------------------------
def text_config(family: Family, config, build, record: dict | None = None) -> dict:
    """The ``text_config`` of a Qwen VL config.json: the Qwen2 decoder with M-RoPE ``rope_parameters``, and the
    token ids recorded at conversion (``record``: ``carried_text_fields``)."""
    head_dim = config.kv_channels or config.hidden_size // config.num_attention_heads
    if head_dim * config.num_attention_heads != config.hidden_size:
        fail(f"--kv-channels {head_dim}: HF's Qwen VL text model takes hidden_size / heads as its head dim")
    out = gpt.hf_config_base(family, config, build)
    for field in ("architectures", "model_type", "torch_dtype", "attention_bias", "head_dim", "rope_theta"):
        out.pop(field, None)
    out.update(use_sliding_window=False, sliding_window=None,
                  rope_parameters={"rope_type": "default", "mrope_section": list(config.mrope_section),
                                   "rope_theta": float(build.rotary_base)})
    out.update({field: value for field, value in (record or {}).items() if field in CARRIED_TEXT_FIELDS})
    return out


def vision_shape(section, hidden_field: str, heads_field: str) -> dict:
    """The vision_config fields both Qwen VL generations share."""
    if section.vision_norm_epsilon != 1e-6:
        fail(f"--vision-norm-epsilon {section.vision_norm_epsilon}: HF's Qwen VL vision tower uses 1e-6")
    return {"depth": section.vision_num_layers, hidden_field: section.vision_hidden_size,
            heads_field: section.vision_num_attention_heads, "in_channels": 3, "patch_size": section.patch_dim,
            "spatial_merge_size": section.vision_spatial_merge_size,
            "temporal_patch_size": section.vision_temporal_patch_size}


def vl_config(family: Family, config, build, section, vision: dict, record: dict | None = None) -> dict:
    return {"architectures": [family.hf_architecture], "model_type": family.hf_model_type, "torch_dtype": "float32",
            **{field: getattr(section, field) for field in TOKEN_FIELDS},
            "tie_word_embeddings": not build.untie_embeddings_and_output_weights,
            "text_config": text_config(family, config, build, record), "vision_config": vision}


def hf_config(config, build, record: dict | None = None, section=None, **_) -> dict:
    if section.vision_ffn_hidden_size % section.vision_hidden_size:
        fail(f"--vision-ffn-hidden-size {section.vision_ffn_hidden_size}: HF's Qwen2-VL takes an integer mlp_ratio of "
             f"the width {section.vision_hidden_size}")
    vision = {**vision_shape(section, "embed_dim", "num_heads"), "hidden_size": config.hidden_size,
              "hidden_act": "quick_gelu", "mlp_ratio": section.vision_ffn_hidden_size // section.vision_hidden_size}
    return vl_config(FAMILY, config, build, section, vision, record)


# ---- tensors ------------------------------------------------------------------------------------------------
def language_map(config, build) -> list[Entry]:
    """The qwen2.5 decoder's map under ``language_model.`` (the HF names are the decoder's own on disk)."""
    return [Entry("language_model." + e.mcore, e.hf, e.to_mcore, e.to_hf) for e in gpt.decoder_map(config, build)]


def fused_qkv(mcore: str, hf: str, heads: int) -> Entry:
    """HF's one ``qkv`` tensor (q rows, k rows, v rows) -> megatron's per-head [q, k, v] rows (weight or bias)."""
    return Entry(mcore, (hf,), lambda t: gpt.qkv_to_mcore(*t.chunk(3), heads, heads),
                 lambda t: (torch.cat(gpt.qkv_to_hf(t, heads, heads)),))


def patch_embed(section) -> Entry:
    shape = (section.vision_hidden_size, 3, section.vision_temporal_patch_size, section.patch_dim, section.patch_dim)
    return Entry("vision_model.patch_embed.weight", ("visual.patch_embed.proj.weight",),
                 lambda w: w.reshape(w.shape[0], -1), lambda t: (t.reshape(shape),))


def vision_map(section, mlp_entries, norm_kinds: tuple) -> list[Entry]:
    """The tower: ``mlp_entries(mcore layer prefix, hf block prefix)`` gives a block's MLP entries; ``norm_kinds``
    the norms' tensors (LayerNorm: weight and bias; RMSNorm: weight)."""
    out = [patch_embed(section)]
    for i in range(section.vision_num_layers):
        m, h = f"vision_model.decoder.layers.{i}.", f"visual.blocks.{i}."
        for kind in norm_kinds:
            out += [gpt.same(f"{m}input_layernorm.{kind}", f"{h}norm1.{kind}"),
                    gpt.same(f"{m}pre_mlp_layernorm.{kind}", f"{h}norm2.{kind}")]
        for kind in ("weight", "bias"):
            out += [fused_qkv(f"{m}self_attention.linear_qkv.{kind}", f"{h}attn.qkv.{kind}",
                              section.vision_num_attention_heads),
                    gpt.same(f"{m}self_attention.linear_proj.{kind}", f"{h}attn.proj.{kind}")]
        out += mlp_entries(m, h)
    out += [gpt.same(f"vision_model.merger_norm.{kind}", f"visual.merger.ln_q.{kind}") for kind in norm_kinds]
    out += [gpt.same(f"vision_model.merger.encoder.linear_fc{i}.{kind}", f"visual.merger.mlp.{j}.{kind}")
            for i, j in ((1, 0), (2, 2)) for kind in ("weight", "bias")]
    return out


def _plain_mlp(m: str, h: str) -> list[Entry]:
    return [gpt.same(f"{m}mlp.linear_fc{i}.{kind}", f"{h}mlp.fc{i}.{kind}")
            for i in (1, 2) for kind in ("weight", "bias")]


def hf_map(config, build, section=None, **_) -> list[Entry]:
    return language_map(config, build) + vision_map(section, _plain_mlp, ("weight", "bias"))


FAMILY = Family(name="qwen2-vl", presets=PRESETS, hf_model_type="qwen2_vl",
                hf_architecture="Qwen2VLForConditionalGeneration", flags_from_hf=flags_from_hf, hf_config=hf_config,
                hf_map=hf_map, hf_section=QwenVlHf,
                vision_encoder="packed", task="qwen_vl")
