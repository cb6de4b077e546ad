"""The data position of a run, as Megatron-LM keeps it: the number of training samples consumed.

Iteration ``k+1`` trains the next global batch ``[consumed, consumed + G)``; G is that iteration's global batch
size from megatron-core's num-microbatches calculator: ``--global-batch-size``, or under ``--rampup-batch-size
start increment samples`` the ramped size for the samples consumed so far. An iteration listed in
``--iterations-to-skip`` (Megatron-LM's numbering: the count of iterations done before it, so ``N`` is the
iteration reported as ``N+1``; with ``--result-rejected-tracker-filename`` also the iterations megatron-core's
rerun machine logged there as reproducibly rejected, as Megatron-LM adds them) consumes its batch untrained.
``SamplePlan`` walks these global batches from a checkpoint's (iteration, consumed samples); the data samplers
(training/data.py, sft/dataset.py, tasks/llava/data.py) and the training loop (training/loop.py) each walk
their own copy, so they agree.
``SamplePlan`` takes data/section.py's ``Batches`` (the batch sizes and skipped iterations), built by its caller.
May assume: the flags validated (global/micro batch size, data-parallel size; rampup checked by schedule_flags.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

from mtmegatron.data.section import Batches


@dataclass(frozen=True)
class GlobalBatch:
    iteration: int          # 1-based, as the loop and metrics.jsonl count
    first: int              # its first sample: the samples consumed before it
    size: int               # samples (this iteration's global batch size)
    num_microbatches: int   # per data-parallel rank
    skipped: bool           # --iterations-to-skip: consumed, not trained


def rejected_iterations(tracker_filename: str) -> list[int]:
    """``--result-rejected-tracker-filename``: the iterations that megatron-core's RerunStateMachine finds
    reproducibly rejected in that file, which Megatron-LM's argument validation appends to
    ``--iterations-to-skip`` (config/schedule_flags.py does)."""
    from megatron.core.rerun_state_machine import RerunStateMachine

    return list(RerunStateMachine.get_skipped_iterations_from_tracker_file(tracker_filename))


def batch_size_calculator(batches: Batches, data_parallel_size: int):
    """megatron-core's num-microbatches calculator for the flags (constant, or ramped over consumed samples).
    Not the process-global one: each plan owns one (rank -1: it logs nothing)."""
    from megatron.core.num_microbatches_calculator import (ConstantNumMicroBatchesCalculator,
                                                           RampupBatchsizeNumMicroBatchesCalculator)

    common = (batches.global_batch_size, batches.micro_batch_size, data_parallel_size, False, -1)
    if batches.rampup_batch_size:
        start, increment, samples = batches.rampup_batch_size
        return RampupBatchsizeNumMicroBatchesCalculator(*common, start, increment, samples)
    return ConstantNumMicroBatchesCalculator(*common)


class SamplePlan:
    """The global batches of iterations ``start_iteration + 1, ...`` (no end), the first beginning at sample
    ``consumed``. ``validation``: constant global batches from sample 0, none skipped. Re-iterable: each
    iteration over it starts again at the same position."""

    def __init__(self, batches: Batches, data_parallel_size: int, start_iteration: int = 0, consumed: int | None = None,
                 validation: bool = False):
        self.batches, self.data_parallel_size = batches, data_parallel_size
        self.start_iteration, self.validation = start_iteration, validation
        self.consumed = start_iteration * batches.global_batch_size if consumed is None else consumed
        self.skip = frozenset() if validation else frozenset(batches.iterations_to_skip or ())

    def __iter__(self) -> Iterator[GlobalBatch]:
        calculator = None if self.validation else batch_size_calculator(self.batches, self.data_parallel_size)
        gbs, mbs, dp = self.batches.global_batch_size, self.batches.micro_batch_size, self.data_parallel_size
        iteration, consumed = self.start_iteration, self.consumed
        while True:
            if calculator is not None:
                calculator.update(consumed, consistency_check=True)
                gbs = calculator.get_current_running_global_batch_size()
            # Megatron-LM tests the iterations done before a step against --iterations-to-skip
            yield GlobalBatch(iteration + 1, consumed, gbs, gbs // (mbs * dp), iteration in self.skip)
            iteration += 1
            consumed += gbs

    def _ramp_end(self) -> int:
        """The consumed-sample count up to which the global batch ramps up (-1 without a ramp-up)."""
        rampup = None if self.validation else self.batches.rampup_batch_size
        return rampup[2] if rampup else -1

    def end_of(self, last_iteration: int) -> int:
        """Samples consumed once iteration ``last_iteration`` is done (past the ramp-up: closed form)."""
        ramp_end = self._ramp_end()
        for batch in self:
            if batch.iteration > last_iteration:
                return batch.first
            if batch.first > ramp_end:
                return batch.first + (last_iteration - batch.iteration + 1) * batch.size

    def last_iteration_within(self, train_samples: int) -> int:
        """The last iteration of a ``--train-samples`` run from this position, by Megatron-LM's count
        (update_train_iters): a ramp-up batch starts while at most ``min(ramp-up samples, train samples)`` are
        consumed; after the ramp-up only whole batches that fit in ``train_samples`` (a partial one is dropped)."""
        ramp_end = self._ramp_end()
        for batch in self:
            if batch.first <= ramp_end:
                if batch.first > train_samples:
                    return batch.iteration - 1
                continue
            return batch.iteration - 1 + max(train_samples - batch.first, 0) // batch.size


def rank_micro_batches(plan: SamplePlan, dp_rank: int) -> Iterator[tuple[int, list[int]]]:
    """(iteration, sample indices) of this DP rank's micro-batches: its contiguous slice of each trained global
    batch, ``--micro-batch-size`` at a time."""
    mbs = plan.batches.micro_batch_size
    for batch in plan:
        if batch.skipped:
            continue
        per_rank = batch.size // plan.data_parallel_size
        first = batch.first + dp_rank * per_rank
        for offset in range(0, per_rank, mbs):
            yield batch.iteration, list(range(first + offset, first + offset + mbs))
