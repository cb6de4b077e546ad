"""What a finished run leaves for a person: the loss-curve PNG and greedy-decoded sample text (printed and
saved to ``<log-dir>/samples.txt``; decoded with megatron-core's KV-cache inference engine, training/sampling.py).

The values read are ``Outputs`` (the log directory and the plot's title, by dest) and, for samples,
training/sampling.py's ``Samples`` and whether the run trained on the embedded corpus, which config/ derives (not
a flag) and the caller passes as a plain value.
May assume: called on every rank after the last iteration (sampling is collective over TP); rank 0 writes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from mtmegatron.utils.metrics import print_rank0
from mtmegatron.training.observability.plots import plot_loss
from mtmegatron.training.sampling import Samples, samples
from mtmegatron.utils.section import Section


@dataclass(frozen=True)
class Outputs(Section):
    """What the end-of-run outputs read beside the samples' values (sampling.py's ``Samples``)."""
    log_dir: str                                        # metrics.jsonl in, loss.png and samples.txt out
    model: str | None                                   # the loss plot's title: family and size
    model_size: str | None


def write_outputs(model, outputs: Outputs, tokenizer=None, sampling: Samples | None = None,
                  embedded_corpus: bool = False) -> None:
    """The loss plot and, with a ``tokenizer``, greedy samples as ``sampling`` says (``embedded_corpus``: the
    built-in prompts fit the run's data)."""
    rank = torch.distributed.get_rank()
    metrics = os.path.join(outputs.log_dir, "metrics.jsonl")
    if rank == 0 and os.path.isfile(metrics) and os.path.getsize(metrics):
        png = plot_loss(metrics, os.path.join(outputs.log_dir, "loss.png"), f"{outputs.model} {outputs.model_size}")
        print_rank0(rank, f"mtmegatron: loss curve {png}")
    if tokenizer is None or sampling.num_samples == 0:
        return
    pairs, note = samples(model, tokenizer, sampling, embedded_corpus)
    if pairs is None:
        print_rank0(rank, f"mtmegatron: no samples: {note}")
        return
    text = "".join(f"--- prompt: {prompt!r}\n{prompt}{continuation}\n" for prompt, continuation in pairs)
    if rank == 0:
        with open(os.path.join(outputs.log_dir, "samples.txt"), "w") as f:
            f.write(text)
    print_rank0(rank, f"mtmegatron: greedy samples ({note}):\n{text.rstrip()}")
