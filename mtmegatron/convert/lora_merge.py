"""``mcore-to-hf --load BASE --lora-load ADAPTERS``: the base's weights with each LoRA adapter folded in
(``W + alpha / r * B @ A``), read as the streaming export reads any parameter (convert/streaming_export.py).

The adapters' checkpoint (a LoRA run's ``--save``) records the rank, alpha, targets and the base's fingerprint
(lora/checkpoint.py); adapters made for another base are refused in one line. The TP1 meta model is wrapped as
a LoRA run wraps it, so the adapter keys, global shapes and resharding (whatever layout wrote them) come from
megatron-core's own sharded state dict, as the base's do. B's rows are in the base weight's row order (fused
q/k/v per query group; [gate; up] for SwiGLU's fc1), so the fold happens before the HF mapping splits them; a
fused linear's A holds one block per part (q, k, v; gate, up) and each B row folds with its own part's block
(lora/adapter.py: row_parts, fused_delta).
May assume: the export's reader (``_Reader``) and the base model flags it was built from.
"""

from __future__ import annotations

import copy

import torch

from mtmegatron.lora.adapter import fused_delta, row_parts
from mtmegatron.models.families import ConversionError


class MergingReader:
    """The base reader, with ``scale * B @ A`` added to every weight that has an adapter (in fp32, then cast
    back to the stored dtype); everything else is the base reader's. ``config``: the model's TransformerConfig
    (which rows of a fused weight are which part)."""

    def __init__(self, base, adapters, scale: float, config):
        self.base, self.adapters, self.scale, self.config = base, adapters, scale, config

    def __getattr__(self, name):
        return getattr(self.base, name)

    def read(self, local: str) -> torch.Tensor:
        tensor = self.base.read(local)
        stem = local[:-len("weight")] if local.endswith(".weight") else None
        if stem is None or stem + "lora.lora_a" not in self.adapters.chunks_of:
            return tensor
        a, b = self.adapters.read(stem + "lora.lora_a"), self.adapters.read(stem + "lora.lora_b")
        parts = row_parts(stem.rstrip("."), self.config, b.shape[0])
        return (tensor.float() + fused_delta(a.float(), b.float(), parts, self.scale)).to(tensor.dtype)


def adapter_reader(reader_type, args, lora_load: str):
    """(reader of the adapters of the latest checkpoint under ``lora_load``, the LoRA values of their record, the
    model's TransformerConfig):
    keys, global shapes and resharding from the TP1 meta model wrapped as their run wrapped it. ``reader_type``:
    the export's reader class; ``args``: the base model's flags."""
    from mtmegatron.convert.model import checkpoint_common
    from mtmegatron.convert.streaming import _meta_model, plan_chunks
    from mtmegatron.lora import checkpoint as lora_checkpoint
    from mtmegatron.lora.section import Lora
    from mtmegatron.lora.wrap import wrap
    from mtmegatron.training.checkpoint.megatron_lm_checkpoint import OURS

    common = checkpoint_common(lora_load, "--lora-load")
    record = (common.get(OURS) or {}).get("lora")
    run = copy.copy(args)
    lora_checkpoint.adopt(run, record, lora_load)
    lora = Lora.of(run)  # what lora/ reads (lora/section.py)
    lora_checkpoint.check(record, "adapters", common["directory"], lora, run)
    (model,) = wrap([_meta_model(run)], lora, run.seed)
    chunks, shapes, _ = plan_chunks(model)
    chunks_of: dict[str, list] = {}
    for c in chunks:
        if lora_checkpoint.is_adapter(c.local):
            chunks_of.setdefault(c.local, []).append(c)
    if not chunks_of:
        raise ConversionError(f"--lora-load {lora_load}: no adapter in the model its record describes")
    adapters = reader_type(common["directory"], chunks_of, shapes, args.vocab_size)
    adapters.check()
    adapters.check_files()
    return adapters, run, model.config


def merging_reader(reader, args, lora_load: str):
    """``reader`` (the base's) wrapped to fold in the adapters of the latest checkpoint under ``lora_load``."""
    adapters, run, config = adapter_reader(type(reader), args, lora_load)
    return MergingReader(reader, adapters, run.lora_alpha / run.lora_r, config)
