"""Packed (THD) micro-batches of vision conversations, and which positions of a micro-batch a context-parallel rank
holds (``--pack-vision-conversations``, ``--context-parallel-size``; the forward step: packed_vision_step.py).

``collate_packed(samples, pad_id, seq_length, multiple)``: the micro-batch's ``mbs`` conversations (the very samples
the padded collate would put in ``mbs`` rows: the data position is the padded run's, so resuming and
``--balance-micro-batches`` are unchanged) laid out as text SFT lays out a micro-batch of ``mbs`` bins
(sft/packing.py): one THD row ``[1, mbs * seq_length]``, conversation after conversation, each with its own 3-D
M-RoPE positions as HF's ``get_rope_index`` gives them for that conversation alone (data/multimodal/vision_samples.py's
``pack``), and the row's unused tail as one more, loss-free, sequence. ``cu_seqlens`` marks every sequence, so
attention never crosses conversations, and a sample's last label is -100, so no target does either. With
``multiple > 1`` (2 x CP) each conversation is followed by loss-free pads up to the multiple (after its last token:
causal attention keeps real tokens from them), ``cu_seqlens`` keeps the real lengths and ``cu_seqlens_padded`` the
padded ones (megatron-core's THD CP convention; attention/cp_batch.py). The vision tensors are concatenated in
conversation order, as in the padded batch, so image embeddings land on the same tokens.
``cp_positions(batch, cp_size, cp_rank)``: the row positions a CP rank holds: chunks ``r`` and ``2*CP-1-r`` of every
sequence of a THD row (``thd_partition_index``), or of the whole row of a padded batch (megatron-core's
load-balanced ``get_batch_on_this_cp_rank`` split: the padded row seen as one sequence).
May assume: every sample fits ``seq_length``; ``seq_length`` is a multiple of ``multiple`` (models/packed_vision_args.py).
"""

from __future__ import annotations

import torch

from mtmegatron.attention.cp_batch import thd_partition_index
from mtmegatron.data.multimodal.template import IGNORE_INDEX
from mtmegatron.data.multimodal.vision_samples import VISION_KEYS, pack
from mtmegatron.sft.packing import round_up


def _filler(length: int, pad_id: int, like: dict) -> dict:
    """``length`` loss-free positions (token ``pad_id``, label -100, position 0) with no pixels."""
    empty = {key: like[key][:0] for key in VISION_KEYS}
    return {"tokens": torch.full((length,), pad_id, dtype=torch.long),
            "labels": torch.full((length,), IGNORE_INDEX, dtype=torch.long),
            "loss_mask": torch.zeros(length), "position_ids": torch.zeros(3, length, dtype=torch.long), **empty}


def _padded_to(sample: dict, multiple: int, pad_id: int) -> dict:
    pad = int(round_up(len(sample["tokens"]), multiple)) - len(sample["tokens"])
    if not pad:
        return sample
    filler = _filler(pad, pad_id, sample)
    return {**sample, **{key: torch.cat([sample[key], filler[key]], dim=-1)
                         for key in ("tokens", "labels", "loss_mask", "position_ids")}}


def collate_packed(samples: list[dict], pad_id: int, seq_length: int, multiple: int = 1) -> dict[str, torch.Tensor]:
    """One THD row ``[1, len(samples) * seq_length]`` of ``samples`` (module docstring)."""
    real = [len(s["tokens"]) for s in samples]
    parts = [_padded_to(s, multiple, pad_id) for s in samples]
    tail = len(samples) * seq_length - sum(len(p["tokens"]) for p in parts)
    assert tail >= 0 and tail % multiple == 0, "every sample fits seq_length, a multiple of 2 x CP"
    if tail:
        parts.append(_filler(tail, pad_id, samples[0]))
        real.append(tail)
    batch = pack(parts)  # cu_seqlens at the (padded) sequence boundaries
    padded = batch.pop("cu_seqlens")
    batch["cu_seqlens"] = torch.cat([torch.zeros(1, dtype=torch.int32),
                                     torch.tensor(real).cumsum(0).to(torch.int32)])
    if multiple > 1:
        batch["cu_seqlens_padded"] = padded
    batch["max_seqlen"] = int((padded[1:] - padded[:-1]).max())
    return batch


def cp_positions(batch: dict, cp_size: int, cp_rank: int) -> torch.Tensor:
    """Row positions CP rank ``cp_rank`` holds (module docstring)."""
    bounds = batch.get("cu_seqlens_padded")
    if bounds is None:  # padded rows: the whole row is one sequence
        bounds = torch.tensor([0, batch["tokens"].shape[1]], dtype=torch.int32)
    return thd_partition_index(bounds.cpu(), cp_size, cp_rank)
