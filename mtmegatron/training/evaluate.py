"""Validation loss: forward-only passes through megatron-core's schedule over the validation sets.

Every evaluation reads the same ``--eval-iters`` global batches (samples ``[0, eval_iters*G)`` of the valid
split, in the layout-independent order of data.py), so successive values are comparable and a resumed run
reports exactly what the uninterrupted one did. Dropout is off (``eval()``), so no RNG state is consumed.
``--full-validation`` (Megatron-LM): each evaluation reads the whole validation set, one epoch built by
megatron-core's builder, as ``len(set) // G`` global batches (the last ``len(set) % G`` samples, fewer than one
global batch, are left out as a drop-last sampler does). ``--multiple-validation-sets`` (with it, as in
Megatron-LM 0.16.1): megatron-core's builder keeps each ``--valid-data-path`` prefix as its own set, and each
set gets its own loss (Megatron-LM's ``validation-0``, ``validation-1``, ...).
The run's ``Step`` (train_step.py; given by its task) reads the validation set and runs its forward step.
The values read are the run's ``Schedule`` (training/section.py); the Step's reader holds its own.
May assume: the model chunks and the valid dataset(s) of the run's kind (GPTDatasets: data.build_gpt_datasets).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from megatron.core import parallel_state

from mtmegatron.training.section import Schedule
from mtmegatron.training.train_step import Step, _global_mean_loss, run_schedule


@dataclass(frozen=True)
class ValidationSet:
    """One validation dataset and the global batches each evaluation reads of it."""
    dataset: object
    eval_iters: int
    index: int | None = None  # --multiple-validation-sets: the set's position in --valid-data-path

    @property
    def suffix(self) -> str:
        """Megatron-LM's name suffix: ``validation-0`` with several sets, plain ``validation`` otherwise."""
        return "" if self.index is None else f"-{self.index}"


def validation_sets(valid, schedule: Schedule) -> list[ValidationSet]:
    """The sets an evaluation reads ([] when none is read): ``valid`` is one dataset, a list of them
    (``--multiple-validation-sets``) or None."""
    if valid is None:
        return []
    datasets = valid if isinstance(valid, list) else [valid]
    many = isinstance(valid, list) or schedule.multiple_validation_sets
    sets = []
    for index, dataset in enumerate(datasets):
        iters = len(dataset) // schedule.global_batch_size if schedule.full_validation else schedule.eval_iters
        sets.append(ValidationSet(dataset, iters, index if many else None))
    return [s for s in sets if s.eval_iters > 0]


def validation_loss(valid_dataset, model, schedule: Schedule, step: Step, eval_iters: int | None = None,
                    valid_set: int | None = None) -> float:
    """Mean LM loss over ``eval_iters`` (default ``--eval-iters``) global batches, the same value on every
    rank; ``step``: the run's (its reader reads ``valid_dataset``); ``valid_set`` names the set for the test
    hook of training/data.py's reader."""
    eval_iters = schedule.eval_iters if eval_iters is None else eval_iters
    dp_rank = parallel_state.get_data_parallel_rank()
    iterators = [step.micro_batches(valid_dataset, dp_rank, validation=True, valid_set=valid_set)
                 for _ in model]
    for chunk in model:
        chunk.eval()
    total = 0.0
    with torch.no_grad():
        for _ in range(eval_iters):
            total += _global_mean_loss(run_schedule(iterators, model, schedule, forward_only=True, step=step), schedule)
    for chunk in model:
        chunk.train()
    return total / max(eval_iters, 1)


def validation_losses(sets: list[ValidationSet], model, schedule: Schedule, step: Step) -> dict[str, float]:
    """Metrics keys -> loss: ``val_loss`` is the first set's (what Megatron-LM logs first), and with several
    sets ``val_loss_<i>`` is set i's."""
    row = {}
    for s in sets:
        loss = validation_loss(s.dataset, model, schedule, step, s.eval_iters, s.index)
        if s.index is not None:
            row[f"val_loss_{s.index}"] = loss
        row.setdefault("val_loss", loss)
    return row
