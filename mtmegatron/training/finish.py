"""What a finished run leaves for a person: the loss-curve PNG and greedy-decoded sample text (printed and
saved to ``<log-dir>/samples.txt``; decoded with megatron-core's KV-cache inference engine, training/sampling.py).

May assume: called on every rank after the last iteration (sampling is collective over TP); rank 0 writes.
"""

from __future__ import annotations

import os

import torch

from mtmegatron.utils.metrics import print_rank0
from mtmegatron.training.observability.plots import plot_loss
from mtmegatron.training.sampling import samples


def write_outputs(model, tokenizer, args) -> None:
    rank = torch.distributed.get_rank()
    metrics = os.path.join(args.log_dir, "metrics.jsonl")
    if rank == 0 and os.path.isfile(metrics) and os.path.getsize(metrics):
        png = plot_loss(metrics, os.path.join(args.log_dir, "loss.png"), f"{args.model} {args.model_size}")
        print_rank0(rank, f"mtmegatron: loss curve {png}")
    if tokenizer is None or args.num_samples == 0:
        return
    pairs, note = samples(model, tokenizer, args)
    if pairs is None:
        print_rank0(rank, f"mtmegatron: no samples: {note}")
        return
    text = "".join(f"--- prompt: {prompt!r}\n{prompt}{continuation}\n" for prompt, continuation in pairs)
    if rank == 0:
        with open(os.path.join(args.log_dir, "samples.txt"), "w") as f:
            f.write(text)
    print_rank0(rank, f"mtmegatron: greedy samples ({note}):\n{text.rstrip()}")
