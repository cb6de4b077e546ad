"""Which conversations go together (the packing plan), and a micro-batch of them as packed THD or padded rows.

A tokenized conversation of ``L`` tokens (its end-of-document token appended) gives ``L - 1`` training
positions: input ``ids[:-1]``, labels ``ids[1:]``, loss on the positions whose label is an assistant token.
So each conversation is shifted on its own and no label ever crosses into the next conversation.

Plan: first-fit decreasing over the whole dataset into bins of ``seq_length`` positions (conversations taken
longest first, each into the first bin with room; ties in the seeded shuffled order), then the bins shuffled
with the seed, again with ``seed + epoch`` for each further epoch. Under context parallelism every
conversation occupies its length rounded up to a multiple of ``2 x CP`` (``multiple``; megatron-core's THD CP
convention, ``cu_seqlens_q_padded``), so the plan depends on the data, the seed, ``seq_length`` and that
multiple only (the same for packed and padded runs at one CP size; CP 1 and CP 2 may group conversations
differently): global batch ``i`` is bins ``[i*G, (i+1)*G)`` and data-parallel rank ``d`` takes the ``d``-th
contiguous slice, ``--micro-batch-size`` bins per micro-batch.

A micro-batch of bins is laid out either
- packed (default): one THD row ``[1, mbs * seq_length]``, each bin's conversations one after another and the
  bin's unused tail as one more (loss-free) sequence; ``cu_seqlens`` marks every sequence, positions restart
  at 0 in each; with ``multiple > 1`` (CP) each conversation is followed by loss-free pad positions up to the
  multiple (the pads count as part of its sequence and sit after its last real token, so causal attention
  keeps real tokens from seeing them), ``cu_seqlens`` stays the real lengths and ``cu_seqlens_padded`` marks
  the padded sequences, which the CP split (attention/cp_batch.py) cuts into ``2 x CP`` chunks each;
- padded (``--no-sft-packing``): one row ``[seq_length]`` per conversation, right-padded, causal attention,
  and loss-free empty rows up to ``mbs x`` the most conversations any bin holds (a fixed shape, which the
  pipeline schedules need).
Both hold the same conversations, so the same global batch gives the same per-token loss and gradient.
May assume: every conversation already fits (``len(ids) - 1 <= seq_length``; the dataset truncates).
"""

from __future__ import annotations

import numpy as np
import torch


def round_up(lengths: np.ndarray, multiple: int) -> np.ndarray:
    return -(-lengths // multiple) * multiple


def first_fit_decreasing(lengths: np.ndarray, capacity: int, seed: int) -> list[list[int]]:
    """Bins (lists of sample indices, in placing order) holding every sample once, none over ``capacity``."""
    order = np.random.RandomState(seed).permutation(len(lengths))
    order = order[np.argsort(-lengths[order], kind="stable")]
    bins: list[list[int]] = []
    room: list[int] = []
    for index in order.tolist():
        need = int(lengths[index])
        for b, free in enumerate(room):  # first fit; the tiny data here makes a linear scan fine
            if free >= need:
                bins[b].append(index)
                room[b] -= need
                break
        else:
            bins.append([index])
            room.append(capacity - need)
    return bins


class Plan:
    """The bins of every epoch, in training order."""

    def __init__(self, bins: list[list[int]], seed: int):
        self.bins = bins
        self.seed = seed
        self._orders: dict[int, np.ndarray] = {}

    def __len__(self) -> int:
        return len(self.bins)

    def bin(self, index: int) -> list[int]:
        epoch, within = divmod(index, len(self.bins))
        if epoch not in self._orders:
            self._orders[epoch] = np.random.RandomState(self.seed + epoch).permutation(len(self.bins))
        return self.bins[int(self._orders[epoch][within])]


def _shifted(ids: np.ndarray, assistant: np.ndarray):
    """(input, labels, loss mask) of one conversation."""
    return ids[:-1], ids[1:], assistant[1:].astype(np.float32)


def packed_batch(samples: list[list[tuple]], seq_length: int, pad_id: int, multiple: int = 1) -> dict:
    """THD micro-batch of ``samples`` (one list of ``(ids, assistant)`` per bin), each sequence padded to a
    multiple of ``multiple`` positions (``cu_seqlens_padded`` is added when ``multiple > 1``)."""
    tokens, labels, mask, positions, cu, cu_padded = [], [], [], [], [0], [0]

    def add(t, l, m):
        pad = int(round_up(np.array(len(t)), multiple)) - len(t)
        tokens.append(np.concatenate([t, np.full(pad, pad_id)]))
        labels.append(np.concatenate([l, np.full(pad, pad_id)]))
        mask.append(np.concatenate([m, np.zeros(pad, np.float32)]))
        positions.append(np.arange(len(t) + pad))
        cu.append(cu[-1] + len(t))
        cu_padded.append(cu_padded[-1] + len(t) + pad)

    for bin_samples in samples:
        used = 0
        for ids, assistant in bin_samples:
            add(*_shifted(ids, assistant))
            used += cu_padded[-1] - cu_padded[-2]
        tail = seq_length - used
        assert tail >= 0 and tail % multiple == 0, "the plan and the seq_length must respect the multiple"
        if tail > 0:  # the bin's unused room: a sequence of its own, with no loss
            add(np.full(tail, pad_id), np.full(tail, pad_id), np.zeros(tail, np.float32))
    batch = {
        "tokens": torch.from_numpy(np.concatenate(tokens).astype(np.int64)).unsqueeze(0),
        "labels": torch.from_numpy(np.concatenate(labels).astype(np.int64)).unsqueeze(0),
        "loss_mask": torch.from_numpy(np.concatenate(mask)).unsqueeze(0),
        "position_ids": torch.from_numpy(np.concatenate(positions).astype(np.int64)).unsqueeze(0),
        "cu_seqlens": torch.tensor(cu, dtype=torch.int32),
        "max_seqlen": int(np.diff(cu_padded).max()),
    }
    if multiple > 1:
        batch["cu_seqlens_padded"] = torch.tensor(cu_padded, dtype=torch.int32)
    return batch


def padded_batch(samples: list[list[tuple]], seq_length: int, pad_id: int, num_rows: int | None = None) -> dict:
    """One right-padded row per conversation of the bins in ``samples``, then empty (loss-free) rows up to
    ``num_rows``."""
    rows = [s for bin_samples in samples for s in bin_samples]
    num_rows = num_rows or len(rows)
    tokens = np.full((num_rows, seq_length), pad_id, np.int64)
    labels = np.full((num_rows, seq_length), pad_id, np.int64)
    mask = np.zeros((num_rows, seq_length), np.float32)
    for r, (ids, assistant) in enumerate(rows):
        t, l, m = _shifted(ids, assistant)
        tokens[r, : len(t)], labels[r, : len(t)], mask[r, : len(t)] = t, l, m
    positions = np.broadcast_to(np.arange(seq_length), tokens.shape).copy()
    return {key: torch.from_numpy(value) for key, value in
            (("tokens", tokens), ("labels", labels), ("loss_mask", mask), ("position_ids", positions))}
