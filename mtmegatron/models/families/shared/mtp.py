"""The HF tensors of DeepSeek-style multi-token-prediction layers (DeepSeek-V3, GLM-4.5): each MTP layer is stored
as decoder layer ``num_layers + k`` with its ``enorm``/``hnorm``/``eh_proj`` and ``shared_head.norm``, plus copies
of the embedding and the output head (``embed_tokens``, ``shared_head.head``), which megatron-core shares with the
main model: read back as nothing (the main model's tensors win), written on the way out.
May assume: what gpt.py assumes.
"""

from __future__ import annotations

import mtmegatron.models.families.gpt as gpt
from mtmegatron.models.families.base import Entry


def mtp_map(num_layers: int, mtp_num_layers: int | None, untied: bool) -> list[Entry]:
    """The map entries of the ``mtp_num_layers`` MTP layers (none without MTP) after ``num_layers`` decoder layers;
    ``untied``: ``--untie-embeddings-and-output-weights`` (the head copied from the output layer)."""
    out = []
    head = "output_layer.weight" if untied else "embedding.word_embeddings.weight"
    for k in range(mtp_num_layers or 0):
        hp = f"model.layers.{num_layers + k}."
        out += [gpt.same(f"mtp.layers.{k}.{m}.weight", f"{hp}{h}.weight") for m, h in
                (("enorm", "enorm"), ("hnorm", "hnorm"), ("eh_proj", "eh_proj"), ("final_layernorm", "shared_head.norm"))]
        out += [Entry(m, (hp + h,), None, lambda t: (t.clone(),)) for m, h in
                (("embedding.word_embeddings.weight", "embed_tokens.weight"), (head, "shared_head.head.weight"))]
    return out
