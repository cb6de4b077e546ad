"""The model families (``--model NAME``): one module per family, and this registry that finds them.

A family module defines ``FAMILY = Family(...)``, the whole of what the rest of the package may know about it:
- ``name``: the ``--model`` value; ``presets``: ``{size: {dest: value}}`` (Megatron-LM dests; explicit flags win);
- ``hf_model_type`` / ``hf_architecture``: its HF ``config.json`` identity (None: no HF mapping);
- ``flags_from_hf(config, **options) -> [flags]`` and ``hf_config(config, build, section=None, **options) ->
  config.json``: the HF config both ways (``ConversionError`` for what cannot be represented); ``config`` is
  megatron-core's TransformerConfig, ``build`` models/section.py's ModelBuild, ``section`` the family's
  ``hf_section`` (filled by convert/model.hf_inputs);
- ``hf_map(config, build, rope_interleave=True, layout=None, section=None) -> [Entry]``: the one table of mcore
  tensor <-> HF tensors with a transform and its inverse, from which convert/mapping.py derives both directions;
- ``matches(fingerprint) -> bool``: whether a checkpoint's recorded model fields (models/fingerprint.py) are this
  family's (asked most specific family first, ``_BY_FINGERPRINT``) when a checkpoint names no ``--model``;
- ``is_multimodal`` (images through a vision tower: the multimodal data, step and model builder) and
  ``chat_template`` (the conversation template its data uses by default; sft/templates.py, data/vision);
- ``model_builder``: ``(TransformerConfig, ModelBuild, LayerChoice, Fusions) -> [model chunks]`` (models/section.py) for a family whose layers megatron-core's
  GPTModel/TransformerLayer cannot express from flags (Gemma 3: models/families/gemma3/model.py); None: models/gpt.py
  builds the plain decoder;
- ``vision_encoder``: ``"packed"`` for the native-resolution vision-language models (Qwen2-VL, Qwen2.5-VL: patches
  of every image in one packed sequence, M-RoPE; models/families/qwen2_vl/model.py builds them), None otherwise (LLaVA's
  fixed-size tiles go by ``is_multimodal``).
- ``build_context(config, build)``: a context manager its model chunks are built inside (models/gpt.py), from the
  TransformerConfig and the build's ``ModelBuild`` (models/section.py), for what megatron-core's modules take from
  neither flags nor config (GPT-OSS's YaRN on a plain attention); default none.
Lookups: ``get(name)``, ``of(args)``, ``by_hf_model_type(model_type)``, ``for_hf_config(config, requested)``,
``from_fingerprint(saved)``, ``preset(model, size)``; ``DEMO`` is the run a command line naming no model gets.
Adding a family: one module here (its ``FAMILY``), listed in ``FAMILIES``, and its tests.
May assume: nothing beyond torch (imported by the map helpers); family modules import only models/ and below.
"""

from __future__ import annotations

from mtmegatron.models.families import gpt, llama3, mistral, mixtral, qwen2_5, qwen3, qwen3_moe
from mtmegatron.models.families import deepseek_v3
from mtmegatron.models.families import gemma3
from mtmegatron.models.families import glm4_moe
from mtmegatron.models.families import gpt_oss
from mtmegatron.models.families import llava
from mtmegatron.models.families.qwen2_vl import qwen2_5_vl
from mtmegatron.models.families import qwen2_vl
from mtmegatron.models.families.base import ConversionError, Entry, Family  # noqa: F401 (the interface)

FAMILIES: dict[str, Family] = {m.FAMILY.name: m.FAMILY for m in (llama3, qwen2_5, qwen3, qwen3_moe, mistral, mixtral,
                                                                 llava, qwen2_vl, qwen2_5_vl, deepseek_v3, glm4_moe,
                                                                 gpt_oss, gemma3, gpt)}
DEMO = ("llama3", "tiny")
_BY_FINGERPRINT = ("gemma3", "deepseek-v3", "glm4.5", "gpt-oss", "qwen3-moe", "mixtral", "qwen2.5", "qwen3", "llama3")


def get(name: str) -> Family:
    return FAMILIES.get(name) or FAMILIES["gpt"]


def of(args) -> Family:
    """The family of parsed flags (a plain Megatron-LM command line is ``gpt``)."""
    return get(args.model or "gpt")


def with_hf_mapping() -> list[str]:
    return [name for name, f in FAMILIES.items() if f.hf_model_type]


def by_hf_model_type(model_type) -> Family | None:
    return next((f for f in FAMILIES.values() if f.hf_model_type and f.hf_model_type == model_type), None)


def for_hf_config(config: dict, requested: str) -> Family:
    """The family of an HF config.json, which must be the ``--model`` asked for (a ConversionError if not)."""
    model_type = config.get("model_type")
    family = by_hf_model_type(model_type)
    if family is None:
        supported = ", ".join(FAMILIES[n].hf_model_type for n in with_hf_mapping())
        raise ConversionError(f"HF model_type {model_type!r} is not supported (supported: {supported})")
    if family.name != requested:
        raise ConversionError(f"--model {requested} does not match the checkpoint's model_type {model_type!r} "
                              f"(use --model {family.name})")
    return family


def from_fingerprint(saved: dict) -> Family:
    return next(FAMILIES[n] for n in _BY_FINGERPRINT if FAMILIES[n].matches(saved))


def preset(model: str, size: str) -> dict:
    if model not in FAMILIES or not FAMILIES[model].presets:
        raise ValueError(f"unknown --model '{model}' (known: {', '.join(n for n, f in FAMILIES.items() if f.presets)})")
    sizes = FAMILIES[model].presets
    if size not in sizes:
        raise ValueError(f"unknown --model-size '{size}' for {model} (known: {', '.join(sizes)})")
    return dict(sizes[size])
