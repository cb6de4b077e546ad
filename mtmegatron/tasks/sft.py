"""Supervised fine-tuning (``--sft`` with a text family): conversations with a chat template, packed into THD rows
or padded rows (mtmegatron/sft/), the per-token loss of training/sft_step.py with the schedule shape of the chosen
layout, and the held-out exact match before and after training (sft/report.py).
The SFT values go down as sft/section.py's ``Sft``, the reader's as data/section.py's ``Batches`` (``SftReader``),
the loss plot's as training/finish.py's ``Outputs``; the task builds them once (``SFTTask.of``).
May assume: flags validated (config/sft_flags.py sets ``--calculate-per-token-loss``); ``prepare`` runs before any
process group (sft/prepare.py completes the run's flags from the data; its ``SFTInputs`` carries the padded
layout's rows).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from mtmegatron.tasks.base import Task, data_parallel_size
from mtmegatron.utils.metrics import print_rank0

if TYPE_CHECKING:  # imported where used: the registry is imported at parse time
    from mtmegatron.data.section import Batches
    from mtmegatron.sft.section import Sft
    from mtmegatron.training.finish import Outputs


@dataclass(frozen=True)
class SftReader:
    """training/data.py's reader for SFT (a Step's ``micro_batches``, called as ``TextReader`` is): ``dataset``
    is sft/prepare.py's ``SFTInputs`` (its packing plan's bins)."""
    batches: Batches
    data_parallel_size: int                             # megatron-core's parallel state (= config/'s)
    sft: Sft

    def __call__(self, dataset, dp_rank: int, start_iteration: int = 0, consumed: int | None = None,
                 validation: bool = False, valid_set: int | None = None):
        from mtmegatron.data.position import SamplePlan
        from mtmegatron.sft.dataset import micro_batches as sft_micro_batches

        plan = SamplePlan(self.batches, self.data_parallel_size, start_iteration, consumed, validation)
        return sft_micro_batches(dataset.data, self.sft, dp_rank, plan, dataset.pad_id, dataset.padded_rows)


@dataclass
class SFTTask(Task):
    sft: Sft
    batches: Batches
    outputs: Outputs
    results: dict = field(default_factory=dict)  # held-out exact match "before" / "after" training (sft_eval.json)

    name = "sft"

    @staticmethod
    def prepare(args: argparse.Namespace, progress: bool):
        from mtmegatron.sft.prepare import prepare

        return prepare(args, progress=progress)

    @classmethod
    def of(cls, values, embedded_corpus: bool) -> "SFTTask":
        """(``embedded_corpus``: no text samples here; the held-out answers are the samples.)"""
        from mtmegatron.data.section import Batches
        from mtmegatron.sft.section import Sft
        from mtmegatron.training.finish import Outputs

        return cls(Sft.of(values), Batches.of(values), Outputs.of(values))

    def datasets(self, rank: int, plan, num_samples: int, data) -> tuple:
        """The conversations and their packing plan (``data``) are the training set; no validation set."""
        print_rank0(rank, f"mtmegatron: {data.summary}")
        return data, None

    def step(self, data):
        from mtmegatron.training import sft_step
        from mtmegatron.training.train_step import Step

        shape = sft_step.schedule_shape(self.sft, data.padded_rows)
        return Step(sft_step.forward_step, shape=shape,
                    micro_batches=SftReader(self.batches, data_parallel_size(), self.sft))

    def start(self, model, data) -> None:
        from mtmegatron.sft.report import held_out_accuracy

        held_out_accuracy(model, data, self.sft, "before", self.results)

    def finish(self, model, data, terminated: bool) -> None:
        """The loss plot; the samples are chat answers to the held-out questions (not after a stop)."""
        from mtmegatron.sft.report import held_out_accuracy
        from mtmegatron.training.finish import write_outputs

        write_outputs(model, self.outputs)  # the loss plot
        if not terminated:
            held_out_accuracy(model, data, self.sft, "after", self.results)
