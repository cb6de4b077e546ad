"""Validation loss: forward-only passes through megatron-core's schedule over the validation split.

Every evaluation reads the same ``--eval-iters`` global batches (samples ``[0, eval_iters*G)`` of the valid
split, in the layout-independent order of data.py), so successive values are comparable and a resumed run
reports exactly what the uninterrupted one did. Dropout is off (``eval()``), so no RNG state is consumed.
May assume: the model chunks, args and a valid GPTDataset from data.build_gpt_datasets.
"""

from __future__ import annotations

import torch
from megatron.core import parallel_state

from mtmegatron.training.data import micro_batches
from mtmegatron.training.train_step import _global_mean_loss, run_schedule


def validation_loss(valid_dataset, model, args) -> float:
    """Mean LM loss over ``--eval-iters`` global batches, the same value on every rank."""
    dp_rank = parallel_state.get_data_parallel_rank()
    iterators = [micro_batches(valid_dataset, args, dp_rank, validation=True) for _ in model]
    for chunk in model:
        chunk.eval()
    total = 0.0
    with torch.no_grad():
        for _ in range(args.eval_iters):
            total += _global_mean_loss(run_schedule(iterators, model, args, forward_only=True), args)
    for chunk in model:
        chunk.train()
    return total / max(args.eval_iters, 1)
