"""What an SFT run prints and leaves: held-out exact match before and after training (``sft_eval.json``) and
chat-formatted greedy answers (``samples.txt``) in ``--log-dir``.

Takes sft/section.py's ``Sft``.
May assume: called on every rank (decoding is collective over TP); rank 0 writes.
"""

from __future__ import annotations

import json
import os

import torch

from mtmegatron.sft.accuracy import can_decode, exact_match, samples_text
from mtmegatron.sft.section import Sft
from mtmegatron.utils.metrics import print_rank0


def held_out_accuracy(model, inputs, sft: Sft, when: str, results: dict) -> None:
    """Score the held-out questions into ``results[when]``; at ``when == "after"`` also write the files."""
    rank = torch.distributed.get_rank()
    if not inputs.held_out or sft.eval_iters == 0:  # --eval-iters 0: no evaluation of any kind
        return
    if not can_decode(model):
        if when == "after":
            print_rank0(rank, "mtmegatron: sft: no held-out accuracy: greedy decoding is not supported with "
                        "virtual pipeline stages, nor with pipeline and context parallelism together")
        return
    accuracy, rows = exact_match(model, inputs.template, inputs.held_out, sft)
    results[when] = accuracy
    print_rank0(rank, f"mtmegatron: sft: held-out exact match {when} training: {accuracy:.1%} "
                f"of {len(inputs.held_out)}")
    if when != "after" or rank != 0:
        return
    os.makedirs(sft.log_dir, exist_ok=True)
    with open(os.path.join(sft.log_dir, "sft_eval.json"), "w") as f:
        json.dump({"held_out": len(inputs.held_out), **{f"exact_match_{k}": v for k, v in results.items()}}, f)
    with open(os.path.join(sft.log_dir, "samples.txt"), "w") as f:
        f.write(samples_text(rows, max(sft.num_samples, 1) * 4))
    print_rank0(rank, f"mtmegatron: sft: answers in {os.path.join(sft.log_dir, 'samples.txt')}:\n"
                f"{samples_text(rows, sft.num_samples).rstrip()}")
