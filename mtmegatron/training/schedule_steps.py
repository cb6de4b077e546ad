"""The step counts megatron-core's ``OptimizerParamScheduler`` takes for a run's schedule flags, and the weight-decay
range, as Megatron-LM's ``get_optimizer_param_scheduler`` (core_v0.16.1) computes them: steps count samples
(iterations x global batch, or the ``--*-samples`` values of sample-based training); ``--lr-warmup-fraction`` is a
share of the decay steps; ``--weight-decay-incr-style constant`` keeps ``--weight-decay``.
config/schedule_flags.py checks the flags with them; training/schedule.py builds the scheduler with them.
May assume: the schedule flags parsed (train_iters set for --train-samples, global_batch_size filled).
"""

from __future__ import annotations

import argparse


def scheduler_steps(args: argparse.Namespace) -> dict:
    """The step counts (in samples) of megatron-core's OptimizerParamScheduler for these flags, as Megatron-LM's
    ``get_optimizer_param_scheduler`` computes them."""
    if args.train_samples is not None:
        decay = args.lr_decay_samples if args.lr_decay_samples is not None else max(args.train_samples, 1)
        warmup = args.lr_warmup_samples
        wsd, wd_incr = args.lr_wsd_decay_samples, args.train_samples
    else:
        gbs = args.global_batch_size
        # --train-iters 0 (write the initial checkpoint) still needs a positive decay length
        decay = (args.lr_decay_iters if args.lr_decay_iters is not None else max(args.train_iters, 1)) * gbs
        warmup = args.lr_warmup_iters * gbs
        wsd = args.lr_wsd_decay_iters * gbs if args.lr_wsd_decay_iters is not None else None
        wd_incr = args.train_iters * gbs
    if args.lr_warmup_fraction is not None:
        warmup = args.lr_warmup_fraction * decay
    return {"lr_warmup_steps": warmup, "lr_decay_steps": decay, "wsd_decay_steps": wsd, "wd_incr_steps": wd_incr}


def weight_decay_range(args: argparse.Namespace) -> tuple[float, float]:
    """(start, end) weight decay: ``--weight-decay`` twice for the constant style."""
    if args.weight_decay_incr_style == "constant":
        return args.weight_decay, args.weight_decay
    return args.start_weight_decay, args.end_weight_decay
