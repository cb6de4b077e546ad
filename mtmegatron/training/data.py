"""Training data: megatron-core's GPT datasets, read in an order that does not depend on the parallel layout.

Global batch ``i`` is always samples ``[i*G, (i+1)*G)`` of the dataset (G = global batch size); data-parallel
rank ``d`` takes the ``d``-th contiguous slice of it, cut into micro-batches. So any TP/PP/DP layout sees the
same global batch, and resuming at iteration ``i`` is exact without saving iterator state.
May assume: megatron-core's dataset builder; mock data needs no files. Real data (``--data-path``, or the
embedded corpus) has been checked and its tokenizer resolved by ``mtmegatron.data.resolve``.
"""

from __future__ import annotations

import argparse
from typing import Iterator

import numpy as np
import torch
from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig, MockGPTDataset
from megatron.core.datasets.utils import get_blend_from_list


class MockTokenizer:
    """The two facts megatron-core's mock dataset needs from a tokenizer."""

    def __init__(self, vocab_size: int):
        self.vocab_size = vocab_size
        self.eod = vocab_size - 1
        self.pad = 0
        self.unique_identifiers = {"class": "MockTokenizer", "vocab_size": vocab_size}


def _build(dataset_class, sizes: list, args: argparse.Namespace, tokenizer, **fields):
    """megatron-core's builder over one GPTDatasetConfig: plain token streams (no position/mask resets, no
    attention mask); ``fields`` add what the caller's data needs (split, blend, cache path)."""
    config = GPTDatasetConfig(
        random_seed=args.seed,
        sequence_length=args.seq_length,
        tokenizer=tokenizer,
        reset_position_ids=False,
        reset_attention_mask=False,
        eod_mask_loss=False,
        create_attention_mask=False,
        **fields,
    )
    return BlendedMegatronDatasetBuilder(dataset_class, sizes, lambda: True, config).build()


def build_mock_dataset(args: argparse.Namespace, num_samples: int):
    train, _, _ = _build(MockGPTDataset, [num_samples, None, None], args, MockTokenizer(args.vocab_size),
                         split="1,0,0")
    return train


def build_gpt_datasets(args: argparse.Namespace, num_train: int, num_valid: int | None, tokenizer):
    """(train, valid) GPTDatasets over ``--data-path`` (a prefix, or a weighted blend ``W1 P1 W2 P2 ...``)
    with the ``--split`` train/valid/test proportions; valid is None when the split gives it nothing."""
    train, valid, _ = _build(GPTDataset, [num_train, num_valid, None], args, tokenizer,
                             blend=get_blend_from_list(args.data_path), split=args.split,
                             path_to_cache=args.data_cache_path)
    return train, valid


def micro_batches(dataset, args: argparse.Namespace, dp_rank: int, start_iteration: int) -> Iterator[dict]:
    """This DP rank's micro-batches for iterations ``start_iteration, start_iteration+1, ...``."""
    if args.sft:  # SFT hook: packed or padded conversations (mtmegatron/sft/dataset.py); dataset: SFTInputs
        from mtmegatron.sft.dataset import micro_batches as sft_micro_batches

        return sft_micro_batches(dataset.data, args, dp_rank, start_iteration, dataset.pad_id)
    if args.model == "llava":  # image + conversation batches (training/multimodal_data.py)
        from mtmegatron.training import multimodal_data

        return multimodal_data.micro_batches(dataset, args, dp_rank, start_iteration)
    return _token_micro_batches(dataset, args, dp_rank, start_iteration)


def _token_micro_batches(dataset, args: argparse.Namespace, dp_rank: int, start_iteration: int) -> Iterator[dict]:
    gbs, mbs, dp = args.global_batch_size, args.micro_batch_size, args.data_parallel_size
    per_rank = gbs // dp
    iteration = start_iteration
    while True:
        first = iteration * gbs + dp_rank * per_rank
        for offset in range(0, per_rank, mbs):
            samples = [dataset[first + offset + k] for k in range(mbs)]
            yield {key: torch.from_numpy(np.stack([s[key].numpy() if torch.is_tensor(s[key]) else s[key]
                                                   for s in samples]))
                   for key in ("tokens", "labels", "loss_mask", "position_ids")}
        iteration += 1
