"""The iteration loop of ``mtmegatron.pretrain``: steps, metrics rows, validation, periodic and final saves, the
skipped-step limit, the exit signal and time limit (training/resilience/robustness.py), and the placement check after the
first step on a device. The data position (consumed/skipped samples) advances by data/position.py's
SamplePlan, whose ``--iterations-to-skip`` iterations consume their batch untrained; when ``--rampup-batch-size``
changes the micro-batch count, a checkpoint is saved first (with ``--save``), as Megatron-LM does. With
--overlap-param-gather the parameters are all-gathered before evaluation and every save and when the loop ends
(training/overlap.py). ``--log-progress`` appends to ``<--save>/progress.txt`` (training/observability/progress_log.py).
``--skip-train`` trains and saves nothing: it prints the validation loss at the loaded iteration (Megatron-LM).

What the schedule runs (forward step, loss, shape, the validation reader) is the run's ``Step``
(training/train_step.py), given by its task: the loop never asks which kind of run it is.
``train`` reads the validated flags as typed sections built once here (its own ``Schedule`` and ``Parallel``,
training/section.py; ``Resilience``, ``Checkpoint``, ``Observability`` for those packages) and never changes them;
the Namespace itself goes only where it is the subject (the checkpoint stores it, wandb logs it); what a run
derives as it goes (the iteration it
started at, skipped steps, where it stopped, whether it was asked to stop) lives in ``RunState``.
May assume: process groups, model, optimizer, scheduler and data iterators are built (training/setup.py).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from megatron.core import parallel_state

from mtmegatron.training import placement
from mtmegatron.training.checkpoint import checkpointing
from mtmegatron.training.observability import memory_report
from mtmegatron.training.checkpoint import non_persistent
from mtmegatron.training.checkpoint.section import Checkpoint
from mtmegatron.training.resilience import pg_timeout
from mtmegatron.training.resilience import rerun
from mtmegatron.training.resilience import robustness
from mtmegatron.training.resilience import weight_hash
from mtmegatron.training.resilience.section import Resilience
from mtmegatron.data.position import SamplePlan
from mtmegatron.data.section import Batches
from mtmegatron.backends.device import compute_device, release_unused_memory
from mtmegatron.training.evaluate import validation_losses, validation_sets
from mtmegatron.training.observability.memory_history import MemoryHistory
from mtmegatron.utils.metrics import print_rank0
from mtmegatron.training.observability.run_hooks import RunHooks
from mtmegatron.training.observability.section import Observability, Shape
from mtmegatron.training.overlap import ParamGather
from mtmegatron.training.section import Parallel, Schedule
from mtmegatron.training.observability.progress_log import ProgressLog
from mtmegatron.training.train_step import Step, StepValues, train_step
from mtmegatron.models.section import AuxLosses


@dataclass
class RunState:
    """What the run derives while it trains (args stay as validated)."""
    start: int = 0                  # the last iteration already done (a loaded checkpoint's)
    last: int = 0                   # the last iteration this run does (or did, after a stop)
    status: int = 0                 # process exit status: 1 after too many skipped steps
    terminated: bool = False        # stopped by --exit-signal(-handler) or --exit-duration-in-mins
    saved_at: int | None = None     # iteration of the newest checkpoint this run wrote
    train_state: dict = None        # saved in checkpoints: skipped steps and the data position (below)

    def __post_init__(self):
        if self.train_state is None:  # consumed/skipped samples: Megatron-LM's counters (data/position.py)
            self.train_state = {"skipped_steps": 0, "consumed_train_samples": 0, "skipped_train_samples": 0,
                                "consumed_valid_samples": 0}


def _validate_only(schedule: Schedule, rank, model, sets, params, obs, state: RunState, step) -> None:
    """``--skip-train`` (Megatron-LM): no training step and no save; the validation loss at the loaded
    iteration (one line per set with --multiple-validation-sets)."""
    state.last = state.start
    if not sets:
        print_rank0(rank, "mtmegatron: --skip-train: nothing to do (no validation data or --eval-iters 0)")
        return
    with params.gathered(), obs.evaluation():
        losses = validation_losses(sets, model, schedule, step)
    for s in sets:
        loss = losses["val_loss" if s.index is None else f"val_loss_{s.index}"]
        print_rank0(rank, f"mtmegatron: --skip-train: validation{s.suffix} loss at iteration {state.start} on "
                    f"validation set | lm loss value: {loss:.6E} | lm loss PPL: {math.exp(min(20.0, loss)):.6E}")


def train(args, backend, rank, model, optimizer, scheduler, iterators, valid, writer, state: RunState,
          step: Step) -> RunState:
    """Train iterations ``state.start + 1 .. state.last``; saves at --save-interval and at the end. ``step``: the
    run's train_step.Step (its task's: forward step, shape, the validation reader)."""
    resilience = Resilience.of(args)  # what training/resilience/ reads, typed and frozen
    schedule = Schedule.of(args)  # iterations, batches, intervals, exit conditions (training/section.py)
    values = StepValues(schedule, resilience, AuxLosses.of(args))  # what one training step reads
    checkpoint = Checkpoint.of(args)  # what training/checkpoint/ reads (save/load build their own from args)
    termination = robustness.TerminationRequest(resilience)
    dp = parallel_state.get_data_parallel_world_size()
    plan = iter(SamplePlan(Batches.of(args), dp, state.start,  # as the iterators'
                           state.train_state["consumed_train_samples"]))
    sets = validation_sets(valid, schedule)  # --full-validation / --multiple-validation-sets: training/evaluate.py
    evaluate = bool(sets) and schedule.eval_interval
    if schedule.full_validation:
        for s in sets:
            print_rank0(rank, f"mtmegatron: --full-validation: validation{s.suffix} set of {len(s.dataset)} samples "
                        f"read as {s.eval_iters} global batches of {schedule.global_batch_size} per evaluation")
    params = ParamGather(model, Parallel.of(args))  # --overlap-param-gather: gathered before anything reads them
    params.start()
    observability, shape = Observability.of(args), Shape.of(args)  # what training/observability/ reads
    obs = RunHooks(observability, shape, vars(args), backend, rank, model, optimizer, writer, state.start)  # --log-*
    rerun.start(resilience, state.start)  # --rerun-mode: result validation and re-runs (training/resilience/rerun.py)
    for line in [rerun.describe(resilience, step.loss_validated)] + non_persistent.startup_lines(
            checkpoint):
        print_rank0(rank, line)
    history = MemoryHistory(observability, backend, rank)  # --record-memory-history
    device = compute_device()
    progress = ProgressLog(observability, shape,  # --log-progress
                           state.train_state.get("num_floating_point_operations_so_far", 0))
    if schedule.skip_train:
        try:
            _validate_only(schedule, rank, model, sets, params, obs, state, step)
        finally:
            obs.close()
            writer.close()
            termination.restore()
        return state

    def save(iteration: int) -> str:
        """A persistent checkpoint of ``iteration`` (--log-progress counts it in and records it)."""
        progress.count_in(state.train_state)
        with obs.saving():
            path = checkpointing.save(checkpoint.save, iteration, model, optimizer, scheduler, args, state.train_state)
        progress.saved(iteration, state.train_state["consumed_train_samples"])
        return path

    try:
        if weight_hash.due(resilience, state.start, first=True):  # --check-weight-hash-across-dp-replicas-interval
            with params.gathered():
                weight_hash.check(model, state.start)
        micro_batches = None  # the previous iteration's count: --rampup-batch-size changes it
        for iteration in range(state.start + 1, state.last + 1):
            batch = next(plan)
            if (checkpoint.save and micro_batches not in (None, batch.num_microbatches)
                    and state.saved_at != iteration - 1):  # Megatron-LM saves before the count changes
                params.sync()
                save(iteration - 1)
                state.saved_at = iteration - 1
            micro_batches = batch.num_microbatches
            if batch.skipped:  # --iterations-to-skip: its samples count as consumed, untrained (Megatron-LM)
                state.train_state["consumed_train_samples"] += batch.size
                state.train_state["skipped_train_samples"] += batch.size
                print_rank0(rank, f"mtmegatron: iteration {iteration} skipped (--iterations-to-skip {iteration - 1}):"
                            f" samples [{batch.first}, {batch.first + batch.size}) not trained")
                continue
            obs.step_begin(iteration)
            t0 = time.perf_counter()
            stats = train_step(iterators, model, optimizer, scheduler, values, iteration, batch, step)
            if "rerun_exit" in stats:  # the rerun machine stops the run before this step's update (rerun.py)
                save, state.status = stats["rerun_exit"]
                state.last, path = iteration - 1, None
                if save and checkpoint.save:
                    params.sync()
                    with obs.saving():
                        path = checkpointing.save(checkpoint.save, state.last, model, optimizer, scheduler, args,
                                                  state.train_state)
                print_rank0(rank, rerun.exit_message(state.status, iteration, save, path))
                break
            release_unused_memory(schedule.empty_unused_memory_level, "step")
            elapsed = time.perf_counter() - t0
            state.train_state["consumed_train_samples"] += batch.size
            progress.trained(batch.size)
            params.after_step(not stats["skipped"])
            if iteration == state.start + 1:  # --distributed-timeout-seconds-after-init
                pg_timeout.after_first_iteration(resilience)
            if iteration == state.start + 1 and not backend.device_is_host:  # the optimizer state exists now
                checked = placement.check(model, optimizer, device)
                print_rank0(rank, f"mtmegatron: placement: all {checked} parameters, buffers, gradient buffers "
                            f"and optimizer states on {device}")
            skipped = state.train_state["skipped_steps"] = state.train_state["skipped_steps"] + int(stats["skipped"])
            row = {"iteration": iteration, **stats, "tokens_per_sec": batch.size * schedule.seq_length / elapsed,
                   "step_time_ms": elapsed * 1000.0, "skipped_steps": skipped}
            if evaluate and (iteration % schedule.eval_interval == 0 or iteration == state.last):
                release_unused_memory(schedule.empty_unused_memory_level, "eval")
                with params.gathered(), obs.evaluation():
                    row.update(validation_losses(sets, model, schedule, step))
                read = sum(s.eval_iters for s in sets) * schedule.global_batch_size
                state.train_state["consumed_valid_samples"] += read
            obs.log(row)  # metrics.jsonl, tensorboard, wandb
            history.after_step(iteration, iteration == state.start + 1)
            memory_report.maybe_report(observability, device, iteration)  # --log-memory-interval
            if weight_hash.due(resilience, iteration, first=False):
                with params.gathered():
                    weight_hash.check(model, iteration)
            if schedule.max_skipped_steps is not None and skipped > schedule.max_skipped_steps:
                print_rank0(rank, f"mtmegatron: error: {skipped} steps skipped for inf/nan "
                            f"loss or gradients (more than --max-skipped-steps {schedule.max_skipped_steps}); "
                            f"stopping at iteration {iteration}")
                state.status, state.last = 1, iteration
                break
            if checkpoint.save and schedule.save_interval and iteration % schedule.save_interval == 0:
                params.sync()
                save(iteration)
                state.saved_at = iteration
            elif non_persistent.due(checkpoint, iteration):  # --non-persistent-save-interval: only the newest kept
                params.sync()
                with obs.saving():
                    checkpointing.save(non_persistent.directory(checkpoint, checkpoint.save), iteration, model,
                                       optimizer, scheduler, args, state.train_state)
            reason = termination.requested()  # --exit-signal-handler / --exit-duration-in-mins
            if reason:
                print_rank0(rank, f"mtmegatron: {reason}: stopping after iteration {iteration}"
                            f"{'' if checkpoint.save else ' (no --save given: no checkpoint written)'}")
                state.last, state.terminated = iteration, True
                break
        params.finish()  # the model is plain from here on: final save, sampling, export
        if (state.status == 0 and checkpoint.save and state.saved_at != state.last
                and (state.last > state.start or state.last == 0)):  # 0: the initial checkpoint
            print_rank0(rank, f"mtmegatron: saved {save(state.last)}")
    finally:
        obs.close()
        writer.close()
        termination.restore()
    return state
