"""One training iteration with megatron-core's pipeline schedules, and the loss that goes with it.

``train_step`` runs forward/backward over all micro-batches (no pipelining, 1F1B or interleaved, chosen by
megatron-core from the parallel state), the optimizer step and the LR schedule, and returns the LM loss
averaged over the global batch on every rank. Megatron-LM's result validation (training/resilience/rerun.py) runs
forward/backward again when a loss or gradient is rejected, and may ask the loop to save and stop.
What the schedule runs is the run's ``Step`` (given by its task, mtmegatron/tasks/): the forward step and loss,
the activation shape and the micro-batch reader; the default is the language model's (``lm_step``). This module
never asks which kind of run it is. The values one step reads come as ``StepValues``: the run's ``Schedule``,
``Resilience`` and the auxiliary losses' ``AuxLosses`` (models/section.py), built once by the loop.
May assume: DDP-wrapped model chunks, megatron optimizer and scheduler, parallel state initialised.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Callable

import torch
from megatron.core import parallel_state
from megatron.core.pipeline_parallel import get_forward_backward_func

from mtmegatron.attention.cp_batch import batch_on_this_cp_rank, cp_loss
from mtmegatron.training.resilience import rerun
from mtmegatron.training.resilience import robustness
from mtmegatron.training.resilience.section import Resilience
from mtmegatron.training.section import Schedule
from mtmegatron.backends.device import compute_device, to_compute_device
from mtmegatron.training.observability.step_timers import timed
from mtmegatron.training import sft_step
from mtmegatron.models.aux_losses import aux_loss_stats
from mtmegatron.models.section import AuxLosses


def loss_func(loss_mask: torch.Tensor, output_tensor: torch.Tensor):
    """Mean token loss of one micro-batch (megatron-core divides by the number of micro-batches)."""
    losses = output_tensor.float().view(-1)
    mask = loss_mask.view(-1).float()
    if parallel_state.get_context_parallel_world_size() > 1:  # this rank holds part of each sequence
        loss, report = cp_loss(losses, mask)
        return rerun.validate_loss(loss), report
    loss = rerun.validate_loss(torch.sum(losses * mask) / mask.sum())
    # clone: the schedule divides the returned loss in place by the number of micro-batches
    return loss, {"lm loss": loss.detach().clone()}


def forward_step(data_iterator, model):
    with timed(model, "batch-generator", log_level=2):
        batch = batch_on_this_cp_rank(to_compute_device(next(data_iterator)))
    # the attention mask is in the batch only with --reset-attention-mask (else the causal mask type applies)
    output = model(batch["tokens"], batch["position_ids"], batch.get("attention_mask"), labels=batch["labels"])
    return output, partial(loss_func, batch["loss_mask"])


@dataclass(frozen=True)
class Step:
    """How megatron-core's schedule runs one kind of run (its task builds it: mtmegatron/tasks/base.py).

    ``forward_step(data_iterator, model) -> (output, loss function)``; ``shape``: the schedule's (seq_length,
    micro_batch_size), None for ``--seq-length`` x ``--micro-batch-size``; ``micro_batches(dataset, dp_rank,
    start_iteration=0, consumed=None, validation=False, valid_set=None)``: a DP rank's micro-batches of a dataset
    of this kind (training/data.py's ``TextReader``, holding what it reads; None: a step whose iterators are made
    elsewhere, e.g. by a test); ``stats(data_iterators, iteration) -> dict``: entries the task
    adds to an iteration's metrics row; ``loss_validated``: False where the task's loss skips the rerun machine's
    checks (LLaVA, as Megatron-LM's pretrain_vlm), which the start-up line then says."""
    forward_step: Callable = forward_step
    shape: tuple[int, int] | None = None
    micro_batches: Callable | None = None
    stats: Callable | None = None
    loss_validated: bool = True


def lm_step(schedule: Schedule, reader: Callable | None = None) -> Step:
    """The language model's step on text batches (``reader``: training/data.py's ``TextReader``): with
    ``--calculate-per-token-loss`` the per-token loss of sft_step.py (megatron-core then sums over the global
    batch), else the micro-batch mean."""
    return Step(sft_step.forward_step if schedule.calculate_per_token_loss else forward_step, micro_batches=reader)


@dataclass(frozen=True)
class StepValues:
    """What one training step reads: the run's ``Schedule``, ``Resilience`` (the rerun machine: the same one for
    equal sections) and ``AuxLosses`` (the auxiliary losses' metrics)."""
    schedule: Schedule
    resilience: Resilience
    aux: AuxLosses

    @classmethod
    def of(cls, values) -> "StepValues":
        """The three sections filled from the run's values (a RunArgs, a Namespace)."""
        return cls(Schedule.of(values), Resilience.of(values), AuxLosses.of(values))


def micro_batches_per_step(schedule: Schedule) -> int:
    """Micro-batches per global batch without ``--rampup-batch-size``: --global-batch-size // (--micro-batch-size x
    data-parallel size), as config/arguments.py checks it divides."""
    return schedule.global_batch_size // (schedule.micro_batch_size * parallel_state.get_data_parallel_world_size())


def _global_mean_loss(losses_reduced: list[dict], schedule: Schedule) -> float:
    """Average the last stage's micro-batch losses, then over data-parallel ranks, visible on every rank."""
    if schedule.calculate_per_token_loss:  # megatron-core's per-token convention: [sum, count] reports (sft_step.py)
        return sft_step.global_per_token_loss(losses_reduced)
    contribution = torch.zeros(1, dtype=torch.float64, device=compute_device())
    is_reporter = (
        parallel_state.is_pipeline_last_stage(ignore_virtual=True)
        and parallel_state.get_tensor_model_parallel_rank() == 0
        and parallel_state.get_context_parallel_rank() == 0
    )
    if is_reporter and losses_reduced:
        mean = torch.stack([d["lm loss"].double() for d in losses_reduced]).mean()
        contribution += mean / parallel_state.get_data_parallel_world_size()
    torch.distributed.all_reduce(contribution)
    return contribution.item()


def run_schedule(data_iterators, model, schedule: Schedule, forward_only: bool, num_microbatches: int | None = None,
                 step: Step | None = None) -> list[dict]:
    """One global batch through megatron-core's schedule (chosen from the parallel state) with ``step`` (default:
    ``lm_step``) and ``num_microbatches`` (default: ``micro_batches_per_step``); the last stage's per-micro-batch
    loss dicts."""
    forward_backward = get_forward_backward_func()
    step = step or lm_step(schedule)
    seq_length, micro_batch_size = step.shape or (schedule.seq_length, schedule.micro_batch_size)
    return forward_backward(
        forward_step_func=step.forward_step,
        data_iterator=data_iterators if len(model) > 1 else data_iterators[0],
        model=model if len(model) > 1 else model[0],
        num_microbatches=num_microbatches or micro_batches_per_step(schedule),
        seq_length=seq_length,
        micro_batch_size=micro_batch_size,
        decoder_seq_length=seq_length,
        forward_only=forward_only,
    )


def train_step(data_iterators, model, optimizer, scheduler, values: StepValues, iteration: int = 0, batch=None,
               step: Step | None = None) -> dict:
    """One optimizer step over a global batch; ``iteration`` only names the step in inf/nan reports. ``batch``
    (training/data.py's GlobalBatch) gives its size and micro-batch count under --rampup-batch-size (default:
    --global-batch-size); the LR schedule advances by that many samples, as Megatron-LM's. ``values``: the run's
    ``StepValues`` (training/loop.py builds them once); ``step``: the run's (default ``lm_step``). When the rerun
    machine stops the run, returns ``{"rerun_exit": (save_checkpoint, exit_code)}`` without a step."""
    schedule = values.schedule
    step = step or lm_step(schedule)
    machine = rerun.machine(values.resilience)
    replayable = rerun.replayable(data_iterators)
    while machine.should_run_forward_backward(replayable):  # once, unless a result was rejected
        for chunk in model:
            chunk.zero_grad_buffer()
        optimizer.zero_grad()
        losses_reduced = run_schedule(replayable, model, schedule, forward_only=False,
                                      num_microbatches=batch.num_microbatches if batch else None, step=step)
    should_checkpoint, should_exit, exit_code = machine.should_checkpoint_and_exit()
    if should_exit:
        return {"rerun_exit": (should_checkpoint, exit_code)}
    lr = optimizer.param_groups[0]["lr"]  # the rate this step uses (the scheduler moves it afterwards)
    if not schedule.fp16 and robustness.nonfinite_step(model, losses_reduced, iteration):
        # inf/nan never reaches the weights (fp16: the optimizer's check)
        update_successful, grad_norm, num_zeros = False, None, None
    else:
        with timed(model[0], "optimizer", log_level=1, barrier=schedule.barrier_with_L1_time):
            update_successful, grad_norm, num_zeros = optimizer.step()
    if update_successful:
        scheduler.step(increment=batch.size if batch else schedule.global_batch_size)
    return {
        "loss": _global_mean_loss(losses_reduced, schedule),
        "grad_norm": float(grad_norm) if grad_norm is not None else None,
        "lr": lr,
        "skipped": not update_successful,
        **({"num_zeros_in_grad": None if num_zeros is None else int(num_zeros)} if schedule.log_num_zeros_in_grad else {}),
        # Megatron-LM's iteration line shows the loss scale after the step (1.0 without --fp16)
        "loss_scale": float(optimizer.get_loss_scale()),
        # mtp_loss / moe_aux_loss / moe_z_loss when the model has them, averaged over --global-batch-size's micro-batches
        **aux_loss_stats(values.aux, micro_batches_per_step(schedule)),
        **(step.stats(data_iterators, iteration) if step.stats else {}),  # e.g. LLaVA's image_tokens
    }
