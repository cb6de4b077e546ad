"""Packed vision conversations (``--vision-packing thd|padded``): SFT's packing plan over image/video conversations,
a micro-batch of its bins as one THD row (or as padded rows, the reference layout), and which positions of a
micro-batch a context-parallel rank holds (the forward step: tasks/qwen_vl/step.py).

``Bins(dataset, seq_length, multiple, seed)``: the conversations grouped as ``--sft`` groups them (sft/packing.py's
``first_fit_decreasing``: longest first, ties in a seeded order, each into the first bin with room, none over
``seq_length``; every conversation counted at its length rounded up to ``multiple`` = 2 x CP). A bin is one sample
of the run: ``--global-batch-size`` and ``--micro-batch-size`` count bins, and ``multimodal_data.MicroBatches`` reads
them in its seeded per-epoch order, so what a global batch holds is a function of the data, ``--seed``,
``--seq-length`` and the CP size alone (resumable; packed and padded runs at one CP size hold the same bins).
``bins.loads`` (text tokens + vision patches per bin) feeds ``--balance-micro-batches``.

``collate_packed(bins, pad_id, seq_length, multiple)``: one THD row ``[1, mbs * seq_length]``, bin after bin, each
bin's conversations one after another with their own 3-D M-RoPE positions (as HF's ``get_rope_index`` gives them
for that conversation alone; data/vision/qwen_vl_samples.py's ``pack``) and the bin's unused tail as one more,
loss-free, sequence. ``cu_seqlens`` marks every sequence, so attention never crosses conversations, and a sample's
last label is -100, so no target does either. With ``multiple > 1`` each conversation is followed by loss-free pads
up to the multiple (after its last token: causal attention keeps real tokens from them); ``cu_seqlens`` keeps the
real lengths, ``cu_seqlens_padded`` the padded ones (megatron-core's THD CP convention; attention/cp_batch.py).
``collate_padded_bins(bins, pad_id, seq_length, rows)``: the same conversations one right-padded row each, then
loss-free rows up to ``rows`` (a fixed shape for the pipeline schedule: mbs x the fullest bin's count).
Vision tensors are concatenated in conversation order in both, so image embeddings land on the same tokens.
``cp_positions(batch, cp_size, cp_rank)``: the row positions a CP rank holds: chunks ``r`` and ``2*CP-1-r`` of every
sequence of a THD row (``thd_partition_index``), or of the whole row of a padded batch (megatron-core's
load-balanced ``get_batch_on_this_cp_rank`` split: the padded row seen as one sequence).
May assume: every sample fits ``seq_length``, a multiple of ``multiple`` (checked for every model under CP).
"""

from __future__ import annotations

import numpy as np
import torch

from mtmegatron.attention.cp_batch import thd_partition_index
from mtmegatron.data.vision.template import IGNORE_INDEX
from mtmegatron.data.vision.qwen_vl_samples import VISION_KEYS, collate_padded, pack
from mtmegatron.sft.packing import first_fit_decreasing, round_up
from mtmegatron.tasks.qwen_vl.section import Packing


def _lengths(dataset) -> list[int]:
    """Tokens of every sample of a ``VisionConversationDataset`` or a ``Subset`` of one (no pixels read)."""
    if isinstance(dataset, torch.utils.data.Subset):
        lengths = _lengths(dataset.dataset)
        return [lengths[i] for i in dataset.indices]
    return list(dataset.lengths)


def _loads(dataset) -> list[int]:
    if isinstance(dataset, torch.utils.data.Subset):
        loads = _loads(dataset.dataset)
        return [loads[i] for i in dataset.indices]
    return list(dataset.loads)


class Bins(torch.utils.data.Dataset):
    """The conversations of ``dataset`` packed into bins of ``seq_length`` tokens (module docstring)."""

    def __init__(self, dataset, seq_length: int, multiple: int, seed: int):
        self.dataset = dataset
        self.bins = first_fit_decreasing(round_up(np.array(_lengths(dataset)), multiple), seq_length, seed)
        loads = _loads(dataset)
        self.loads = [sum(loads[i] for i in b) for b in self.bins]
        self.fill = sum(_lengths(dataset)) / (len(self.bins) * seq_length)

    def __len__(self) -> int:
        return len(self.bins)

    def __getitem__(self, index: int) -> list[dict]:
        return [self.dataset[i] for i in self.bins[index]]


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


def collate_packed(bins: list[list[dict]], pad_id: int, seq_length: int, multiple: int = 1) -> dict[str, torch.Tensor]:
    """One THD row ``[1, len(bins) * seq_length]`` of the bins' conversations (module docstring)."""
    parts, real = [], []
    for samples in bins:
        padded = [_padded_to(s, multiple, pad_id) for s in samples]
        tail = seq_length - sum(len(p["tokens"]) for p in padded)
        assert tail >= 0 and tail % multiple == 0, "the plan fits each bin in seq_length, a multiple of 2 x CP"
        real += [len(s["tokens"]) for s in samples]
        if tail:
            padded.append(_filler(tail, pad_id, samples[0]))
            real.append(tail)
        parts += padded
    batch = pack(parts)  # cu_seqlens at the (padded) sequence boundaries
    bounds = batch.pop("cu_seqlens")
    batch["cu_seqlens"] = torch.cat([torch.zeros(1, dtype=torch.int32),
                                     torch.tensor(real).cumsum(0).to(torch.int32)])
    if multiple > 1:
        batch["cu_seqlens_padded"] = bounds
    batch["max_seqlen"] = int((bounds[1:] - bounds[:-1]).max())
    return batch


def collate_padded_bins(bins: list[list[dict]], pad_id: int, seq_length: int, rows: int) -> dict[str, torch.Tensor]:
    """One right-padded row per conversation of ``bins``, then loss-free rows up to ``rows``."""
    samples = [s for samples in bins for s in samples]
    batch = collate_padded(samples, pad_id, seq_length)
    empty = rows - len(samples)
    if empty:
        extra = collate_padded([_filler(seq_length, pad_id, samples[0])] * empty, pad_id, seq_length)
        extra["attention_mask"].zero_()
        for key in ("tokens", "labels", "loss_mask", "attention_mask"):
            batch[key] = torch.cat([batch[key], extra[key]])
        batch["position_ids"] = torch.cat([batch["position_ids"], extra["position_ids"]], dim=1)
    return batch


def cp_positions(batch: dict, cp_size: int, cp_rank: int) -> torch.Tensor:
    """Row positions CP rank ``cp_rank`` holds (module docstring)."""
    bounds = batch.get("cu_seqlens_padded")
    if bounds is None:  # padded rows: the whole row is one sequence
        bounds = torch.tensor([0, batch["tokens"].shape[1]], dtype=torch.int32)
    return thd_partition_index(bounds.cpu(), cp_size, cp_rank)


def binned(train, valid, packing: Packing, pad_id: int):
    """``(train bins, held-out bins or None, collate, summary, padded rows)`` of ``--vision-packing`` (module
    docstring); the padded layout's rows are mbs x the fullest bin's conversations, train and held-out (None
    for THD)."""
    from functools import partial

    multiple = 2 * packing.context_parallel_size if packing.context_parallel_size > 1 else 1
    train_bins = Bins(train, packing.seq_length, multiple, packing.seed)
    valid_bins = Bins(valid, packing.seq_length, multiple, packing.seed) if valid is not None else None
    if packing.vision_packing == "thd":
        collate = partial(collate_packed, pad_id=pad_id, seq_length=packing.seq_length, multiple=multiple)
        layout = f"one THD row of {packing.micro_batch_size} bins per micro-batch"
        rows = None
    else:
        fullest = max(len(b) for bins in (train_bins, valid_bins) if bins is not None for b in bins.bins)
        rows = packing.micro_batch_size * fullest
        collate = partial(collate_padded_bins, pad_id=pad_id, seq_length=packing.seq_length, rows=rows)
        layout = f"{rows} padded rows per micro-batch"
    summary = (f"packed into {len(train_bins)} train bins of {packing.seq_length} tokens ({train_bins.fill:.0%} "
               f"full), {layout}")
    return train_bins, valid_bins, collate, summary, rows
