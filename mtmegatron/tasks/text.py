"""Plain language-model pretraining: megatron-core's mock data (``--mock-data``) or GPT datasets over indexed
text (``--data-path``, ``--train/valid/test-data-path``, or the embedded corpus), the language model's step
(training/train_step.py's ``lm_step``), and greedy samples of the embedded corpus's prompts at the end.
May assume: flags validated; ``prepare`` runs before any process group (data/resolve.py resolves the data).
"""

from __future__ import annotations

import argparse

from mtmegatron.tasks.base import Task
from mtmegatron.utils.metrics import print_rank0


class TextTask(Task):
    name = "text"

    def prepare(self, args: argparse.Namespace, progress: bool):
        """The tokenizer (None for mock data without --tokenizer-type): data/resolve.py."""
        from mtmegatron.data.resolve import resolve_data

        return resolve_data(args, progress=progress)

    def datasets(self, args: argparse.Namespace, rank: int, plan, num_samples: int, data) -> tuple:
        from mtmegatron.data.section import GptData, Splits
        from mtmegatron.training.data import (build_gpt_datasets, build_mock_dataset, build_mock_validation,
                                              describe_data)

        num_valid, gpt, splits = args.eval_iters * args.global_batch_size, GptData.of(args), Splits.of(args)
        if args.mock_data:  # validation only with --eval-interval or --skip-train
            valid_samples = num_valid if args.eval_interval or args.skip_train else 0
            return build_mock_dataset(gpt, num_samples), build_mock_validation(gpt, valid_samples)
        dataset, valid = build_gpt_datasets(gpt, splits, num_samples, num_valid or None, data)
        print_rank0(rank, f"mtmegatron: data {describe_data(splits)} | {len(dataset)} train samples"
                    f"{f', {_valid_sizes(valid)} valid' if valid is not None else ', no validation split'}"
                    f" | tokenizer {data.source} ({data.vocab_size} tokens)")
        return dataset, valid

    def step(self, args: argparse.Namespace, data):
        from mtmegatron.training.train_step import lm_step

        return lm_step(args)

    def finish(self, model, args: argparse.Namespace, data, terminated: bool) -> None:
        """The loss plot and greedy samples (none after a stop: the launcher's grace period is short)."""
        from mtmegatron.training.finish import write_outputs

        write_outputs(model, None if terminated else data, args)


def _valid_sizes(valid) -> str:
    """Samples of the validation set, or of each set (``--multiple-validation-sets``: ``N0 + N1 + ...``)."""
    return " + ".join(str(len(v)) for v in valid) if isinstance(valid, list) else str(len(valid))
