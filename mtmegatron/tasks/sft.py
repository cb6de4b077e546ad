"""Supervised fine-tuning (``--sft`` with a text family): conversations with a chat template, packed into THD rows
or padded rows (mtmegatron/sft/), the per-token loss of training/sft_step.py with the schedule shape of the chosen
layout, and the held-out exact match before and after training (sft/report.py).
The SFT values go down as sft/section.py's ``Sft`` (built per call from the run's args, the Task interface).
May assume: flags validated (config/sft_flags.py sets ``--calculate-per-token-loss``); ``prepare`` runs before any
process group (its ``SFTInputs`` carries the padded layout's rows).
"""

from __future__ import annotations

import argparse

from mtmegatron.tasks.base import Task
from mtmegatron.utils.metrics import print_rank0


def micro_batches(dataset, args: argparse.Namespace, dp_rank: int, start_iteration: int = 0,
                  consumed: int | None = None, validation: bool = False, valid_set: int | None = None):
    """training/data.py's reader for SFT: ``dataset`` is sft/prepare.py's ``SFTInputs`` (its packing plan's bins)."""
    from mtmegatron.data.position import SamplePlan
    from mtmegatron.data.section import Batches
    from mtmegatron.sft.dataset import micro_batches as sft_micro_batches
    from mtmegatron.sft.section import Sft

    plan = SamplePlan(Batches.of(args), args.data_parallel_size, start_iteration, consumed, validation)
    return sft_micro_batches(dataset.data, Sft.of(args), dp_rank, plan, dataset.pad_id, dataset.padded_rows)


class SFTTask(Task):
    name = "sft"

    def __init__(self):
        self.results = {}  # held-out exact match "before" / "after" training (sft_eval.json)

    def prepare(self, args: argparse.Namespace, progress: bool):
        from mtmegatron.sft.prepare import prepare

        return prepare(args, progress=progress)

    def datasets(self, args: argparse.Namespace, rank: int, plan, num_samples: int, data) -> tuple:
        """The conversations and their packing plan (``data``) are the training set; no validation set."""
        print_rank0(rank, f"mtmegatron: {data.summary}")
        return data, None

    def step(self, args: argparse.Namespace, data):
        from mtmegatron.sft.section import Sft
        from mtmegatron.training import sft_step
        from mtmegatron.training.train_step import Step

        shape = sft_step.schedule_shape(Sft.of(args), data.padded_rows)
        return Step(sft_step.forward_step, shape=shape, micro_batches=micro_batches)

    def start(self, model, args: argparse.Namespace, data) -> None:
        from mtmegatron.sft.report import held_out_accuracy
        from mtmegatron.sft.section import Sft

        held_out_accuracy(model, data, Sft.of(args), "before", self.results)

    def finish(self, model, args: argparse.Namespace, data, terminated: bool) -> None:
        """The loss plot; the samples are chat answers to the held-out questions (not after a stop)."""
        from mtmegatron.sft.report import held_out_accuracy
        from mtmegatron.sft.section import Sft
        from mtmegatron.training.finish import write_outputs

        write_outputs(model, None, args)
        if not terminated:
            held_out_accuracy(model, data, Sft.of(args), "after", self.results)
