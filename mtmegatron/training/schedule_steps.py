"""The step counts megatron-core's ``OptimizerParamScheduler`` takes for a run's schedule flags, and the weight-decay
range, as Megatron-LM's ``get_optimizer_param_scheduler`` (core_v0.16.1) computes them: steps count samples
(iterations x global batch, or the ``--*-samples`` values of sample-based training); ``--lr-warmup-fraction`` is a
share of the decay steps; ``--weight-decay-incr-style constant`` keeps ``--weight-decay``.
config/schedule_flags.py checks the flags with them; training/schedule.py builds the scheduler with them.
May assume: the schedule flags parsed (train_iters set for --train-samples, global_batch_size filled).
"""

from __future__ import annotations

from mtmegatron.training.section import LrSchedule


def scheduler_steps(schedule: LrSchedule) -> dict:
    """The step counts (in samples) of megatron-core's OptimizerParamScheduler for these flags, as Megatron-LM's
    ``get_optimizer_param_scheduler`` computes them."""
    if schedule.train_samples is not None:
        decay = schedule.lr_decay_samples if schedule.lr_decay_samples is not None else max(schedule.train_samples, 1)
        warmup = schedule.lr_warmup_samples
        wsd, wd_incr = schedule.lr_wsd_decay_samples, schedule.train_samples
    else:
        gbs = schedule.global_batch_size
        # --train-iters 0 (write the initial checkpoint) still needs a positive decay length
        decay = (schedule.lr_decay_iters if schedule.lr_decay_iters is not None else max(schedule.train_iters, 1)) * gbs
        warmup = schedule.lr_warmup_iters * gbs
        wsd = schedule.lr_wsd_decay_iters * gbs if schedule.lr_wsd_decay_iters is not None else None
        wd_incr = schedule.train_iters * gbs
    if schedule.lr_warmup_fraction is not None:
        warmup = schedule.lr_warmup_fraction * decay
    return {"lr_warmup_steps": warmup, "lr_decay_steps": decay, "wsd_decay_steps": wsd, "wd_incr_steps": wd_incr}


def weight_decay_range(schedule: LrSchedule) -> tuple[float, float]:
    """(start, end) weight decay: ``--weight-decay`` twice for the constant style."""
    if schedule.weight_decay_incr_style == "constant":
        return schedule.weight_decay, schedule.weight_decay
    return schedule.start_weight_decay, schedule.end_weight_decay
