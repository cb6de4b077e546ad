"""Tensor names and layouts between HF checkpoints and our (single-rank, TP1) megatron-core model, both ways from
the family's one map (``Family.hf_map``: mcore tensor, HF tensors, transform and inverse; models/families/).

``mcore_sources(family, args)`` gives, per mcore tensor, the HF tensors it is computed from and how (the streaming
hf-to-mcore reads one at a time); ``hf_groups(family, args)`` the way back in bounded groups (one entry each;
an entry whose ``mcore`` is a tuple is one group of those tensors, GPT-OSS's stacked experts; an entry without
``to_hf`` is the way in only);
``hf_only_names`` the HF tensors written on the way back only (copies, stand-ins: ignorable on the way in).
May assume: args from config/arguments.py for the same network; fp32 or any float dtype tensors.
"""

from __future__ import annotations

from typing import Callable

from mtmegatron.models import families


def _entries(family: str, args, rope_interleave: bool, hf_layout: dict | None) -> list:
    from mtmegatron.convert.model import hf_inputs

    return families.get(family).hf_map(**hf_inputs(args), rope_interleave=rope_interleave,
                                       layout=(hf_layout or {}).get(family))


def mcore_sources(family: str, args, rope_interleave: bool = True, hf_layout: dict | None = None) -> dict:
    """``{mcore name: (HF names, transform)}``: the tensor is ``transform(*HF tensors)``. Lets a streaming
    converter read only what one output needs (convert/streaming.py). ``hf_layout[family]``: the family's key
    layout as recorded at conversion (LLaVA's prefixes)."""
    return {e.mcore: (e.hf, e.to_mcore) for e in _entries(family, args, rope_interleave, hf_layout)
            if e.to_mcore is not None}


def hf_only_names(family: str, args, rope_interleave: bool = True, hf_layout: dict | None = None) -> set[str]:
    return {n for e in _entries(family, args, rope_interleave, hf_layout)
            if e.to_mcore is None and isinstance(e.mcore, str) for n in e.hf}


def _named(entry) -> Callable[..., dict]:
    return lambda *tensors: dict(zip(entry.hf, entry.to_hf(*tensors)))


def hf_groups(family: str, args, rope_interleave: bool = True,
              hf_layout: dict | None = None) -> list[tuple[tuple[str, ...], Callable[..., dict]]]:
    """The way back as bounded groups: ``[(mcore names, transform)]`` where ``transform(*mcore tensors)`` returns
    ``{HF name: tensor}``. Lets a streaming exporter hold one group at a time (convert/streaming_export.py)."""
    return [((e.mcore,) if isinstance(e.mcore, str) else e.mcore, _named(e))
            for e in _entries(family, args, rope_interleave, hf_layout) if e.to_hf is not None]
