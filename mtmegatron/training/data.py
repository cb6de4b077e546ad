"""Training data: megatron-core's GPT datasets, read in an order that does not depend on the parallel layout.

The data position is the number of samples consumed, as in Megatron-LM: the global batch of an iteration is the
next ``G`` samples ``[consumed, consumed + G)`` (G = that iteration's global batch size), and a checkpoint records
``consumed_train_samples``, so resuming with another ``--global-batch-size`` neither repeats nor skips a sample.
``SamplePlan`` walks the iterations: G comes from megatron-core's num-microbatches calculator (constant, or
``--rampup-batch-size``'s ramp over consumed samples), and an iteration of ``--iterations-to-skip`` (Megatron-LM's
numbering: the number of iterations done before it) consumes its batch without training it. Data-parallel rank
``d`` takes the ``d``-th contiguous slice of the global batch, cut into micro-batches, so any TP/PP/DP layout
sees the same global batch. Validation reads samples ``[0, eval_iters*G)`` of its split each time. The samples
are read by a torch DataLoader with ``--num-workers`` worker processes (Megatron-LM's default 2; 0 reads in the
training process) over a batch sampler of exactly those indices, so workers change where samples are read, not
which. Megatron-LM's data flags (config/data_flags.py) go to megatron-core's GPTDatasetConfig.
Test hook: ``MTMEGATRON_TEST_TRAINED_SAMPLES=DIR`` makes each rank append one JSON line per training micro-batch
it hands to the model, ``{"iteration": I, "samples": [...]}``, to ``DIR/rank<R>.jsonl`` (validation micro-batches
to ``DIR/valid-rank<R>.jsonl``, or ``DIR/valid<i>-rank<R>.jsonl`` for set i of several).
The dataset builders take data/section.py's ``GptData`` (and ``Splits``), built by the task; the reader
``TextReader`` holds the batch sizes (``Batches``), the data-parallel size, the loader's ``Loader`` section and
``Resilience`` (the workers' exit signal), and is called as every task's reader is (train_step.Step.micro_batches).
May assume: megatron-core's dataset builder; mock data needs no files. Real data (``--data-path``, or the
embedded corpus) has been checked and its tokenizer resolved by ``mtmegatron.data.resolve``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Iterator

import numpy as np
import torch
from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig, MockGPTDataset
from megatron.core.datasets.utils import get_blend_from_list

from mtmegatron.data.splits import per_split_paths, requested_splits
from mtmegatron.data.position import SamplePlan, rank_micro_batches
from mtmegatron.data.section import Batches, GptData, Splits
from mtmegatron.training.resilience.robustness import data_worker_init
from mtmegatron.training.resilience.section import Resilience
from mtmegatron.data.dataset_fields import dataset_config_fields
from mtmegatron.utils.section import Section


@dataclass(frozen=True)
class Loader(Section):
    """What the text reader's DataLoader reads (training/data.py's ``TextReader``)."""
    num_workers: int                                    # DataLoader worker processes (0: in the training process)
    seed: int                                           # the loader's own generator (the workers' base seed)


class MockTokenizer:
    """The two facts megatron-core's mock dataset needs from a tokenizer: Megatron-LM's ``NullTokenizer
    --vocab-size V-1`` (V ids, end-of-document V-1). Like it, no pad id: megatron-core's dataset then pads with
    -1, which no token equals, so no label is masked (a pad id 0 would drop every label 0 from the loss)."""

    def __init__(self, vocab_size: int):
        self.vocab_size = vocab_size
        self.eod = vocab_size - 1
        self.unique_identifiers = {"class": "MockTokenizer", "vocab_size": vocab_size}


class _PristineMaskCache:
    """megatron-core 0.16's GPTDataset caches the first sample's loss mask (when no EOD/reset flag is on) and then
    zeroes that sample's pad-label positions in the very tensor it cached, so every later sample read by the same
    process inherits them: loss masks depended on which sample a process read first (each DataLoader worker
    starts elsewhere; measured: 31 vs 30 unmasked tokens in one micro-batch, first loss 4.86944 vs 4.86657). The
    cacheable mask is all ones; after the first read the cache gets a fresh one."""

    def __getitem__(self, idx):
        sample = super().__getitem__(idx)
        if self.masks_and_position_ids_are_cached and sample["loss_mask"] is self.cached_loss_mask:
            self.cached_loss_mask = torch.ones_like(self.cached_loss_mask)
        return sample


class PretrainGPTDataset(_PristineMaskCache, GPTDataset):
    pass


class PretrainMockGPTDataset(_PristineMaskCache, MockGPTDataset):
    pass


def _build(dataset_class, sizes: list, data: GptData, tokenizer, **fields):
    """megatron-core's builder over one GPTDatasetConfig with Megatron-LM's data flags (document resets, EOD
    loss mask, mmap); ``fields`` add what the caller's data needs (split or per-split blends, cache path). The
    attention mask is built only for ``--reset-attention-mask``: otherwise it is the causal mask type."""
    config = GPTDatasetConfig(
        random_seed=data.seed,
        sequence_length=data.seq_length,
        tokenizer=tokenizer,
        reset_position_ids=data.reset_position_ids,
        reset_attention_mask=data.reset_attention_mask,
        eod_mask_loss=data.eod_mask_loss,
        create_attention_mask=data.reset_attention_mask and data.create_attention_mask_in_dataloader,
        mmap_bin_files=data.mmap_bin_files,
        **dataset_config_fields(data),  # the builder's threads, surplus, caches (config/training_flags.py)
        **fields,
    )
    return BlendedMegatronDatasetBuilder(dataset_class, sizes, lambda: True, config).build()


def build_mock_dataset(data: GptData, num_samples: int):
    train, _, _ = _build(PretrainMockGPTDataset, [num_samples, None, None], data, MockTokenizer(data.vocab_size),
                         split="1,0,0")
    return train


def build_mock_validation(data: GptData, num_samples: int | None):
    """``--mock-data`` with ``--eval-interval`` (or ``--skip-train``, where validation is all the run does; the
    caller asks no samples otherwise): megatron-core's mock dataset as the valid split (random documents like
    the training ones, as Megatron-LM evaluates on mock data); None without validation."""
    if not num_samples:
        return None
    _, valid, _ = _build(PretrainMockGPTDataset, [None, num_samples, None], data, MockTokenizer(data.vocab_size),
                         split="0,1,0")
    return valid


def build_gpt_datasets(data: GptData, splits: Splits, num_train: int, num_valid: int | None, tokenizer):
    """(train, valid) GPTDatasets over ``--data-path`` (a prefix, or a weighted blend ``W1 P1 W2 P2 ...``) cut by
    ``--split``, or over the separate ``--train/valid/test-data-path`` blends; valid is None when there is no
    validation data. ``--full-validation``: valid is one epoch of its split (``num_valid`` is not used), and
    with ``--multiple-validation-sets`` megatron-core's builder returns a list, one per valid prefix."""
    per_split = per_split_paths(splits)
    if per_split:
        fields = {"blend_per_split": [get_blend_from_list(p) if p else None for p in per_split]}
    else:
        fields = {"blend": get_blend_from_list(splits.data_path), "split": splits.split}
    if data.full_validation:  # one epoch of the valid split; with several sets, one per --valid-data-path prefix
        num_valid = None
        fields.update(full_validation=True, multiple_validation_sets=data.multiple_validation_sets)
    sizes = [num_train] + requested_splits(splits, num_valid)
    train, valid, _ = _build(PretrainGPTDataset, sizes, data, tokenizer, path_to_cache=data.data_cache_path, **fields)
    return train, valid


def describe_data(splits: Splits) -> str:
    """The data source in one phrase, for the start-up line."""
    per_split = per_split_paths(splits)
    if not per_split:
        return f"{' '.join(splits.data_path)} (split {splits.split})"
    return " | ".join(f"{name} {' '.join(p)}" for name, p in zip(("train", "valid", "test"), per_split) if p)


TRAINED_SAMPLES_ENV = "MTMEGATRON_TEST_TRAINED_SAMPLES"


@dataclass(frozen=True)
class TextReader:
    """The reader of GPT datasets (a task's ``Step.micro_batches``): called as ``reader(dataset, dp_rank,
    start_iteration=0, consumed=None, validation=False, valid_set=None)``, as every task's reader is."""
    batches: Batches
    data_parallel_size: int                             # megatron-core's parallel state (= config/'s)
    loader: Loader
    resilience: Resilience

    @classmethod
    def of(cls, values, data_parallel_size: int) -> "TextReader":
        """Its sections filled from the run's values (a RunArgs, a Namespace)."""
        return cls(Batches.of(values), data_parallel_size, Loader.of(values), Resilience.of(values))

    def __call__(self, dataset, dp_rank: int, start_iteration: int = 0, consumed: int | None = None,
                 validation: bool = False, valid_set: int | None = None) -> Iterator[dict]:
        """This DP rank's micro-batches of a GPT dataset for iterations ``start_iteration + 1, ...`` (SamplePlan:
        from sample ``consumed``, default ``start_iteration`` x global batch); ``validation``: the validation
        order (``valid_set``: which of several validation sets, for the test hook's file name). Other kinds of
        data are read by their task's reader (train_step.Step.micro_batches, mtmegatron/tasks/)."""
        plan = SamplePlan(self.batches, self.data_parallel_size, start_iteration, consumed, validation)
        loader = torch.utils.data.DataLoader(
            dataset, batch_sampler=MicroBatchIndices(plan, dp_rank), collate_fn=_stack,
            num_workers=self.loader.num_workers,
            worker_init_fn=data_worker_init(self.resilience),  # outlives the exit signal
            # its own generator: iter() draws the workers' base seed from it, not from torch's default generator,
            # which on the cpu backend is also the device generator that dropout draws from
            generator=torch.Generator().manual_seed(self.loader.seed))
        record = os.environ.get(TRAINED_SAMPLES_ENV)
        if record:
            name = f"valid{valid_set if valid_set is not None else ''}-" if validation else ""
            return _recorded(loader, MicroBatchIndices(plan, dp_rank), record, name)
        return iter(loader)


class MicroBatchIndices:
    """Batch sampler: the sample indices of this DP rank's micro-batches, iteration after iteration (no end)."""

    def __init__(self, plan: SamplePlan, dp_rank: int):
        self.plan, self.dp_rank = plan, dp_rank

    def __iter__(self) -> Iterator[list[int]]:
        for _, indices in rank_micro_batches(self.plan, self.dp_rank):
            yield indices

    def with_iterations(self) -> Iterator[tuple[int, list[int]]]:
        return rank_micro_batches(self.plan, self.dp_rank)


def _recorded(loader, indices: MicroBatchIndices, directory: str, name: str = "") -> Iterator[dict]:
    """The loader's micro-batches, each recorded (test hook) as it is handed out: the DataLoader keeps the
    sampler's order, so a second walk of the same sampler names each batch's samples."""
    path = os.path.join(directory, f"{name}rank{torch.distributed.get_rank()}.jsonl")
    for (iteration, samples), batch in zip(indices.with_iterations(), loader):
        with open(path, "a") as f:
            f.write(json.dumps({"iteration": iteration, "samples": samples}) + "\n")
        yield batch


def _stack(samples: list[dict]) -> dict:
    """One micro-batch: the samples' tensors stacked (the attention mask only where the dataset built it)."""
    keys = [k for k in ("tokens", "labels", "loss_mask", "position_ids", "attention_mask") if k in samples[0]]
    return {key: torch.from_numpy(np.stack([s[key].numpy() if torch.is_tensor(s[key]) else s[key]
                                            for s in samples]))
            for key in keys}
