"""The family record (``Family``) and the HF map's row (``Entry``) that every family module fills in; the registry
and its interface are described in models/families/__init__.py.
May assume: nothing (pure data types).
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Callable, NamedTuple


class ConversionError(ValueError):
    """A checkpoint or config that cannot be converted as asked; the message says why."""


class Entry(NamedTuple):
    """One mcore tensor and the HF tensors it is made of: ``to_mcore(*hf tensors) -> tensor`` and
    ``to_hf(tensor) -> hf tensors`` (in ``hf`` order). ``to_mcore`` None: written on the way back only (a copy, a
    stand-in), ignorable on the way in."""

    mcore: str
    hf: tuple
    to_mcore: Callable | None
    to_hf: Callable


@dataclasses.dataclass(frozen=True)
class Family:
    name: str
    presets: dict
    hf_model_type: str | None = None
    hf_architecture: str | None = None
    flags_from_hf: Callable | None = None
    hf_config: Callable | None = None
    hf_map: Callable | None = None
    # the section (utils/section.py) of what hf_config/hf_map read beyond TransformerConfig and ModelBuild; convert/
    # fills it from the flags and passes it as ``section=`` (None: the family reads nothing else)
    hf_section: type | None = None
    matches: Callable = lambda saved: False
    is_multimodal: bool = False
    vision_encoder: str | None = None  # "packed": native-resolution patches in one sequence (models/families/qwen2_vl/model.py)
    chat_template: str | None = None
    task: str = "text"  # the kind of run it trains (mtmegatron/tasks/registry.py; --sft picks "sft" for a text family)
    build_context: Callable = lambda config, build: contextlib.nullcontext()  # its model chunks are built inside
    # (config, ModelBuild, LayerChoice, Fusions) -> model chunks, for layers no flag expresses (gemma3/)
    model_builder: Callable | None = None
