"""The layer-spec hook that selects mtmegatron's attention and context parallelism.

With ``--attention-backend auto|flash|fused`` (flags.py) ``SDPADotProductAttention`` goes into every
``core_attention`` slot that holds megatron-core's ``DotProductAttention`` or a subclass of it (e.g.
``--transformer-impl mtmegatron``'s fused-softmax one); ``local``/``unfused`` leave the spec alone. A
TransformerEngine core attention already in a spec is never replaced (TE stays the choice on CUDA when used).
``apply_attention_to_spec(spec, args)`` accepts a transformer *layer* ModuleSpec or a decoder *block* spec
(``TransformerBlockSubmodules`` with ``layer_specs``) and edits it in place (also returning it).
May assume: argparse namespaces from mtmegatron.training.arguments; megatron-core 0.16.x.
"""

from __future__ import annotations

import argparse

from megatron.core.transformer.dot_product_attention import DotProductAttention

from mtmegatron.attention.core import SDPADotProductAttention
from mtmegatron.attention.flags import LOCAL_BACKENDS


def _is_replaceable(core_attention) -> bool:
    return isinstance(core_attention, type) and issubclass(core_attention, DotProductAttention)


def _apply_to_layer(layer_spec) -> None:
    attention = getattr(getattr(layer_spec, "submodules", None), "self_attention", None)
    submodules = getattr(attention, "submodules", None)
    if submodules is not None and _is_replaceable(getattr(submodules, "core_attention", None)):
        submodules.core_attention = SDPADotProductAttention


def apply_attention_to_spec(spec, args: argparse.Namespace):
    """Put SDPADotProductAttention into a layer or block spec unless ``--attention-backend local|unfused``."""
    if getattr(args, "attention_backend", "auto") in LOCAL_BACKENDS:
        return spec
    for layer in getattr(spec, "layer_specs", None) or [spec]:
        _apply_to_layer(layer)
    return spec
