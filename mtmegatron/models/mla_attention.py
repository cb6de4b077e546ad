"""Megatron-core's local ``DotProductAttention`` with MLA's head dimensions.

MLA builds its core attention with ``k_channels`` (qk_head_dim + qk_pos_emb_head_dim) and ``v_channels``
(v_head_dim), which only TransformerEngine's attention accepts; the local one takes neither and sizes its
output as ``kv_channels * heads``. Its math is already head-dim agnostic (the softmax scale comes from MLA),
so the subclass here only accepts the two arguments and sizes the output from ``v_channels``.
``models/layer_spec.py`` puts it into MLA layers whose core attention is megatron's or the fused-softmax one.
May assume: megatron-core 0.16's DotProductAttention (forward reshapes to ``hidden_size_per_partition``).
"""

from __future__ import annotations

from functools import lru_cache



@lru_cache(maxsize=None)
def with_head_dims(base: type) -> type:
    """A subclass of ``base`` (DotProductAttention or a subclass) that takes k_channels/v_channels."""

    def __init__(self, *args, k_channels=None, v_channels=None, **kwargs):
        base.__init__(self, *args, **kwargs)
        if v_channels is not None:
            self.hidden_size_per_attention_head = v_channels
            self.hidden_size_per_partition = v_channels * self.num_attention_heads_per_partition

    return type(f"MLA{base.__name__}", (base,), {"__init__": __init__, "__doc__": base.__doc__})
