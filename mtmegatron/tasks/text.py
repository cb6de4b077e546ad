"""Plain language-model pretraining: megatron-core's mock data (``--mock-data``) or GPT datasets over indexed
text (``--data-path``, ``--train/valid/test-data-path``, or the embedded corpus), the language model's step
(training/train_step.py's ``lm_step`` with training/data.py's ``TextReader``), and greedy samples of the embedded
corpus's prompts at the end.
May assume: flags validated; ``prepare`` runs before any process group (data/resolve.py resolves the data).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import TYPE_CHECKING

from mtmegatron.tasks.base import Task, data_parallel_size
from mtmegatron.tasks.section import RunKind
from mtmegatron.utils.metrics import print_rank0

if TYPE_CHECKING:  # imported where used: the registry is imported at parse time
    from mtmegatron.data.section import Batches, GptData, Splits
    from mtmegatron.training.data import Loader
    from mtmegatron.training.finish import Outputs
    from mtmegatron.training.resilience.section import Resilience
    from mtmegatron.training.sampling import Samples
    from mtmegatron.training.section import Schedule


@dataclass(frozen=True)
class TextTask(Task):
    kind: RunKind                   # --mock-data
    schedule: Schedule              # the validation samples asked of the builder
    gpt: GptData                    # megatron-core's GPTDatasetConfig values
    splits: Splits
    batches: Batches                # the reader's
    loader: Loader
    resilience: Resilience
    outputs: Outputs                # the loss plot
    samples: Samples                # greedy samples at the end
    embedded_corpus: bool           # the built-in sample prompts fit the data

    name = "text"

    @staticmethod
    def prepare(args: argparse.Namespace, progress: bool):
        """The tokenizer (None for mock data without --tokenizer-type): data/resolve.py."""
        from mtmegatron.data.resolve import resolve_data

        return resolve_data(args, progress=progress)

    @classmethod
    def of(cls, values, embedded_corpus: bool) -> "TextTask":
        from mtmegatron.data.section import Batches, GptData, Splits
        from mtmegatron.training.data import Loader
        from mtmegatron.training.finish import Outputs
        from mtmegatron.training.resilience.section import Resilience
        from mtmegatron.training.sampling import Samples
        from mtmegatron.training.section import Schedule

        return cls(RunKind.of(values), Schedule.of(values), GptData.of(values), Splits.of(values),
                   Batches.of(values), Loader.of(values), Resilience.of(values), Outputs.of(values),
                   Samples.of(values), embedded_corpus)

    def datasets(self, rank: int, plan, num_samples: int, data) -> tuple:
        from mtmegatron.training.data import (build_gpt_datasets, build_mock_dataset, build_mock_validation,
                                              describe_data)

        schedule = self.schedule
        num_valid = schedule.eval_iters * schedule.global_batch_size
        if self.kind.mock_data:  # validation only with --eval-interval or --skip-train
            valid_samples = num_valid if schedule.eval_interval or schedule.skip_train else 0
            return build_mock_dataset(self.gpt, num_samples), build_mock_validation(self.gpt, valid_samples)
        dataset, valid = build_gpt_datasets(self.gpt, self.splits, num_samples, num_valid or None, data)
        print_rank0(rank, f"mtmegatron: data {describe_data(self.splits)} | {len(dataset)} train samples"
                    f"{f', {_valid_sizes(valid)} valid' if valid is not None else ', no validation split'}"
                    f" | tokenizer {data.source} ({data.vocab_size} tokens)")
        return dataset, valid

    def step(self, data):
        from mtmegatron.training.data import TextReader
        from mtmegatron.training.train_step import lm_step

        return lm_step(self.schedule, TextReader(self.batches, data_parallel_size(), self.loader, self.resilience))

    def finish(self, model, data, terminated: bool) -> None:
        """The loss plot and greedy samples (none after a stop: the launcher's grace period is short)."""
        from mtmegatron.training.finish import write_outputs

        write_outputs(model, self.outputs, None if terminated else data, self.samples, self.embedded_corpus)


def _valid_sizes(valid) -> str:
    """Samples of the validation set, or of each set (``--multiple-validation-sets``: ``N0 + N1 + ...``)."""
    return " + ".join(str(len(v)) for v in valid) if isinstance(valid, list) else str(len(valid))
