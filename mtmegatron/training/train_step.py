"""One training iteration with megatron-core's pipeline schedules, and the loss that goes with it.

``train_step`` runs forward/backward over all micro-batches (no pipelining, 1F1B or interleaved, chosen by
megatron-core from the parallel state), the optimizer step and the LR schedule, and returns the LM loss
averaged over the global batch on every rank. Megatron-LM's result validation (training/resilience/rerun.py) runs
forward/backward again when a loss or gradient is rejected, and may ask the loop to save and stop.
May assume: DDP-wrapped model chunks, megatron optimizer and scheduler, parallel state initialised.
"""

from __future__ import annotations

from functools import partial

import torch
from megatron.core import parallel_state
from megatron.core.pipeline_parallel import get_forward_backward_func

from mtmegatron.attention.cp_batch import batch_on_this_cp_rank, cp_loss
from mtmegatron.training.resilience import rerun
from mtmegatron.training.resilience import robustness
from mtmegatron.backends.device import compute_device, to_compute_device
from mtmegatron.training.observability.step_timers import timed
from mtmegatron.tasks.qwen_vl.data import reads_vision_data
from mtmegatron.models.aux_losses import aux_loss_stats
from mtmegatron.models import families


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


def _global_mean_loss(losses_reduced: list[dict], args) -> float:
    """Average the last stage's micro-batch losses, then over data-parallel ranks, visible on every rank."""
    if args.calculate_per_token_loss:  # SFT hook: [sum, count] reports (mtmegatron/training/sft_step.py)
        from mtmegatron.training.sft_step import global_per_token_loss

        return global_per_token_loss(losses_reduced)
    contribution = torch.zeros(1, dtype=torch.float64, device=compute_device())
    is_reporter = (
        parallel_state.is_pipeline_last_stage(ignore_virtual=True)
        and parallel_state.get_tensor_model_parallel_rank() == 0
        and parallel_state.get_context_parallel_rank() == 0
    )
    if is_reporter and losses_reduced:
        mean = torch.stack([d["lm loss"].double() for d in losses_reduced]).mean()
        contribution += mean / args.data_parallel_size
    torch.distributed.all_reduce(contribution)
    return contribution.item()


def run_schedule(data_iterators, model, args, forward_only: bool, num_microbatches: int | None = None) -> list[dict]:
    """One global batch through megatron-core's schedule (chosen from the parallel state); the last stage's
    per-micro-batch loss dicts."""
    forward_backward = get_forward_backward_func()
    seq_length, micro_batch_size = args.seq_length, args.micro_batch_size
    if families.of(args).is_multimodal:
        from mtmegatron.tasks.llava.step import forward_step as step
    elif reads_vision_data(args):  # native-resolution vision conversations (tasks/qwen_vl/step.py)
        from mtmegatron.tasks.qwen_vl.step import forward_step as step
        from mtmegatron.tasks.qwen_vl.step import schedule_shape as vision_shape

        seq_length, micro_batch_size = vision_shape(args)
    elif args.calculate_per_token_loss:  # SFT hook: packed THD batches, per-token loss (mtmegatron/training/sft_step.py)
        from mtmegatron.training.sft_step import forward_step as step
        from mtmegatron.training.sft_step import schedule_shape

        if args.sft:
            seq_length, micro_batch_size = schedule_shape(model, args)
    else:
        step = forward_step
    return forward_backward(
        forward_step_func=step,
        data_iterator=data_iterators if len(model) > 1 else data_iterators[0],
        model=model if len(model) > 1 else model[0],
        num_microbatches=num_microbatches or args.num_microbatches,
        seq_length=seq_length,
        micro_batch_size=micro_batch_size,
        decoder_seq_length=seq_length,
        forward_only=forward_only,
    )


def train_step(data_iterators, model, optimizer, scheduler, args, iteration: int = 0, batch=None) -> dict:
    """One optimizer step over a global batch; ``iteration`` only names the step in inf/nan reports. ``batch``
    (training/data.py's GlobalBatch) gives its size and micro-batch count under --rampup-batch-size (default:
    --global-batch-size); the LR schedule advances by that many samples, as Megatron-LM's. When the
    rerun machine stops the run, returns ``{"rerun_exit": (save_checkpoint, exit_code)}`` without a step."""
    machine = rerun.machine(args)
    replayable = rerun.replayable(data_iterators)
    while machine.should_run_forward_backward(replayable):  # once, unless a result was rejected
        for chunk in model:
            chunk.zero_grad_buffer()
        optimizer.zero_grad()
        losses_reduced = run_schedule(replayable, model, args, forward_only=False,
                                      num_microbatches=batch.num_microbatches if batch else None)
    should_checkpoint, should_exit, exit_code = machine.should_checkpoint_and_exit()
    if should_exit:
        return {"rerun_exit": (should_checkpoint, exit_code)}
    lr = optimizer.param_groups[0]["lr"]  # the rate this step uses (the scheduler moves it afterwards)
    if not args.fp16 and robustness.nonfinite_step(model, losses_reduced, iteration):
        # inf/nan never reaches the weights (fp16: the optimizer's check)
        update_successful, grad_norm, num_zeros = False, None, None
    else:
        with timed(model[0], "optimizer", log_level=1, barrier=args.barrier_with_L1_time):
            update_successful, grad_norm, num_zeros = optimizer.step()
    if update_successful:
        scheduler.step(increment=batch.size if batch else args.global_batch_size)
    return {
        "loss": _global_mean_loss(losses_reduced, args),
        "grad_norm": float(grad_norm) if grad_norm is not None else None,
        "lr": lr,
        "skipped": not update_successful,
        **({"num_zeros_in_grad": None if num_zeros is None else int(num_zeros)} if args.log_num_zeros_in_grad else {}),
        # Megatron-LM's iteration line shows the loss scale after the step (1.0 without --fp16)
        "loss_scale": float(optimizer.get_loss_scale()),
        **aux_loss_stats(args),  # mtp_loss / moe_aux_loss / moe_z_loss when the model has them
        **({"image_tokens": data_iterators[0].image_tokens(iteration)} if families.of(args).is_multimodal else {}),
    }
