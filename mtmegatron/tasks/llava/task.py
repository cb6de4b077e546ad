"""The LLaVA task (``Family.task == "llava"``): image + conversation data (data.py), LLaVAModel's forward step
(step.py), and at the end the held-out loss with and without the images and greedy answers (finish.py).
``VisionTask`` holds what both vision tasks read (the reader's sections, the ``Schedule``, ``VisionOutputs`` and
the loss plot's ``Outputs``); ``vision_splits`` is their ``datasets``.
May assume: flags validated for ``--model llava`` (models/families/llava/flags.py); see tasks/base.py.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import TYPE_CHECKING

from mtmegatron.tasks.base import Task, data_parallel_size
from mtmegatron.tasks.llava.data import Split, VisionReader, balance_summary, prepare
from mtmegatron.tasks.section import RunKind, VisionOutputs, VisionReading
from mtmegatron.utils.metrics import print_rank0

if TYPE_CHECKING:  # imported where used: the registry is imported at parse time
    from mtmegatron.data.section import Batches
    from mtmegatron.training.finish import Outputs
    from mtmegatron.training.section import Schedule


def vision_splits(reading: VisionReading, rank: int, plan, data) -> tuple:
    """(train Split, held-out Split or None) of prepared vision data, with its start-up line(s): the data
    summary, and with ``--balance-micro-batches`` the balance over the first global batches (rank 0)."""
    dataset = Split(data.train, data.collate, shuffle=True)
    valid = Split(data.valid, data.collate, shuffle=False) if data.valid is not None else None
    print_rank0(rank, f"mtmegatron: {data.info['summary']} | tokenizer {data.tokenizer.source}")
    if reading.balance_micro_batches and rank == 0:
        print(f"mtmegatron: {balance_summary(dataset, reading, plan)}", flush=True)
    return dataset, valid


@dataclass(frozen=True)
class VisionTask(Task):
    """What both vision tasks read; a subclass names its step, preparation and finish."""
    batches: Batches                # the reader's
    reading: VisionReading
    schedule: Schedule              # the held-out evaluations
    vision_outputs: VisionOutputs
    outputs: Outputs                # the loss plot

    @classmethod
    def of(cls, values, embedded_corpus: bool) -> "VisionTask":
        """(``embedded_corpus``: not read; the held-out answers are the samples.)"""
        return cls(**cls.sections(values))

    @classmethod
    def sections(cls, values) -> dict:
        """The task's fields filled from the run's values (a RunArgs)."""
        from mtmegatron.data.section import Batches
        from mtmegatron.training.finish import Outputs
        from mtmegatron.training.section import Schedule

        return dict(batches=Batches.of(values), reading=VisionReading.of(values), schedule=Schedule.of(values),
                    vision_outputs=VisionOutputs.of(values), outputs=Outputs.of(values))

    def reader(self) -> VisionReader:
        return VisionReader(self.batches, data_parallel_size(), self.reading)

    def datasets(self, rank: int, plan, num_samples: int, data) -> tuple:
        return vision_splits(self.reading, rank, plan, data)


class LlavaTask(VisionTask):
    name = "llava"

    @staticmethod
    def prepare(args: argparse.Namespace, progress: bool):
        from mtmegatron.data.vision.section import LlavaData
        from mtmegatron.models.families.llava.flags import image_embeddings_per_tile

        return prepare(LlavaData.of(args), image_embeddings_per_tile(args), RunKind.of(args).mock_data, progress)

    def step(self, data):
        from mtmegatron.tasks.llava.step import llava_step

        return llava_step(self.reader())

    def finish(self, model, data, terminated: bool) -> None:
        """The loss plot, the held-out loss with and without images, and (not after a stop) greedy answers."""
        from mtmegatron.tasks.llava.finish import write_multimodal_outputs
        from mtmegatron.training.finish import write_outputs

        write_outputs(model, self.outputs)  # the loss plot
        write_multimodal_outputs(model, data, self.vision_outputs, self.schedule, self.reader(),
                                 sample=not terminated)
