"""The LLaVA task (``Family.task == "llava"``): image + conversation data (data.py), LLaVAModel's forward step
(step.py), and at the end the held-out loss with and without the images and greedy answers (finish.py).
May assume: flags validated for ``--model llava`` (models/families/llava/flags.py); see tasks/base.py.
"""

from __future__ import annotations

import argparse

from mtmegatron.tasks.base import Task
from mtmegatron.tasks.llava.data import Split, balance_summary, prepare
from mtmegatron.utils.metrics import print_rank0


def vision_splits(args: argparse.Namespace, rank: int, plan, data) -> tuple:
    """(train Split, held-out Split or None) of prepared vision data, with its start-up line(s): the data
    summary, and with ``--balance-micro-batches`` the balance over the first global batches (rank 0)."""
    dataset = Split(data.train, data.collate, shuffle=True)
    valid = Split(data.valid, data.collate, shuffle=False) if data.valid is not None else None
    print_rank0(rank, f"mtmegatron: {data.info['summary']} | tokenizer {data.tokenizer.source}")
    if args.balance_micro_batches and rank == 0:
        print(f"mtmegatron: {balance_summary(dataset, args, plan)}", flush=True)
    return dataset, valid


class LlavaTask(Task):
    name = "llava"

    def prepare(self, args: argparse.Namespace, progress: bool):
        return prepare(args, progress=progress)

    def datasets(self, args: argparse.Namespace, rank: int, plan, num_samples: int, data) -> tuple:
        return vision_splits(args, rank, plan, data)

    def step(self, args: argparse.Namespace, data):
        from mtmegatron.tasks.llava.step import llava_step

        return llava_step()

    def finish(self, model, args: argparse.Namespace, data, terminated: bool) -> None:
        """The loss plot, the held-out loss with and without images, and (not after a stop) greedy answers."""
        from mtmegatron.tasks.llava.finish import write_multimodal_outputs
        from mtmegatron.training.finish import write_outputs

        write_outputs(model, None, args)
        write_multimodal_outputs(model, data, args, sample=not terminated)
