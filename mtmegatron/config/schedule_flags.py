"""Sample-based training, LR warmup/decay variants (fraction, init, WSD) and the weight-decay schedule: the
Megatron-LM flags and their rules (the step counts megatron-core's ``OptimizerParamScheduler`` takes are
training/schedule_steps.py's).

Megatron-LM semantics (``megatron/training/training.py`` ``update_train_iters`` / ``get_optimizer_param_scheduler``
at core_v0.16.1): a run is either iteration-based (``--train-iters``, ``--lr-decay-iters``, ``--lr-warmup-iters``,
``--lr-wsd-decay-iters``) or sample-based (``--train-samples``, ``--lr-decay-samples``, ``--lr-warmup-samples``,
``--lr-wsd-decay-samples``), never a mix. With ``--train-samples N`` the run does ``N // global batch``
iterations (a partial last batch is dropped; under ``--rampup-batch-size``, which needs sample-based training,
Megatron-LM's count over the ramp, data/position.py) and the scheduler's steps are the sample counts;
with iterations they are iterations x global batch. ``--lr-warmup-fraction`` is a share of the decay steps.
``--weight-decay-incr-style constant`` (default) keeps ``--weight-decay``; ``linear``/``cosine`` go from
``--start-weight-decay`` to ``--end-weight-decay`` over the whole run.
Where Megatron-LM would assert or fail inside megatron-core (WSD without its decay length, warmup not shorter
than the decay, a flag of the other mode), this is one ``ConfigError`` line before any process group.
May assume: ``--train-iters``, ``--lr-decay-iters``, ``--lr-warmup-iters``, ``--lr``, ``--min-lr``,
``--weight-decay`` and ``--lr-decay-style`` are registered elsewhere (arguments.py); ``args.given_flags`` (the
dests the user gave, config/flag_sources.py) is set; ``check_schedule_args`` runs after data_parallel_size is
derived and before ``--lr-decay-iters`` gets its default.
"""

from __future__ import annotations

import argparse

from mtmegatron.data.position import SamplePlan, rejected_iterations
from mtmegatron.data.section import Batches
from mtmegatron.training.schedule_steps import scheduler_steps
from mtmegatron.utils.errors import ConfigError

WSD_DECAY_STYLES = ["exponential", "linear", "cosine", "minus_sqrt"]
WD_INCR_STYLES = ["constant", "linear", "cosine"]


def add_schedule_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("sample-based training, LR warmup/decay variants, weight-decay schedule")
    g.add_argument("--train-samples", type=int, default=None,
                   help="train on this many samples (iterations = samples // global batch); excludes --train-iters")
    g.add_argument("--lr-warmup-samples", type=int, default=0,
                   help="samples of linear LR warmup (sample-based training)")
    g.add_argument("--lr-decay-samples", type=int, default=None,
                   help="samples to decay the LR over (sample-based training; default --train-samples)")
    g.add_argument("--lr-warmup-fraction", type=float, default=None,
                   help="warmup length as a fraction of the LR decay length (instead of --lr-warmup-iters/samples)")
    g.add_argument("--lr-warmup-init", type=float, default=0.0, help="LR at the start of the warmup")
    g.add_argument("--lr-wsd-decay-style", type=str, default="exponential", choices=WSD_DECAY_STYLES,
                   help="--lr-decay-style WSD: shape of the final annealing phase")
    g.add_argument("--lr-wsd-decay-iters", type=int, default=None,
                   help="--lr-decay-style WSD: iterations of the final annealing phase")
    g.add_argument("--lr-wsd-decay-samples", type=int, default=None,
                   help="--lr-decay-style WSD: samples of the final annealing phase (sample-based training)")
    g.add_argument("--weight-decay-incr-style", type=str, default="constant", choices=WD_INCR_STYLES,
                   help="constant: --weight-decay throughout; linear/cosine: --start- to --end-weight-decay")
    g.add_argument("--start-weight-decay", type=float, default=None,
                   help="weight decay at the start of a linear/cosine --weight-decay-incr-style")
    g.add_argument("--end-weight-decay", type=float, default=None,
                   help="weight decay at the end of a linear/cosine --weight-decay-incr-style")


def _check_mode(args: argparse.Namespace) -> None:
    """One of iteration- or sample-based training, with only that mode's flags (Megatron-LM's rules). With
    --train-samples, iteration values a preset filled (not the user) give way to Megatron-LM's defaults."""
    given = args.given_flags
    if args.train_samples is not None:
        if "train_iters" in given:
            raise ConfigError("--train-iters and --train-samples are mutually exclusive: give one")
        for dest, unset in (("lr_decay_iters", None), ("lr_warmup_iters", 0), ("lr_wsd_decay_iters", None)):
            flag = "--" + dest.replace("_", "-")
            if dest in given and getattr(args, dest) != unset:
                raise ConfigError(f"{flag} is for iteration-based training; with --train-samples use "
                                  f"{flag.replace('-iters', '-samples')}")
            setattr(args, dest, unset)
        if args.train_samples < 0:
            raise ConfigError("--train-samples must be >= 0")
        _check_rampup(args)
        plan = SamplePlan(Batches.of(args), args.data_parallel_size)
        args.train_iters = (plan.last_iteration_within(args.train_samples) if args.rampup_batch_size
                            else args.train_samples // args.global_batch_size)
        return
    if args.train_iters is None:
        raise ConfigError("give --train-iters or --train-samples")
    if args.rampup_batch_size:
        raise ConfigError("--rampup-batch-size needs sample-based training (--train-samples), as in Megatron-LM: the "
                          "ramp counts samples")
    for flag, value, unset in (("--lr-decay-samples", args.lr_decay_samples, None),
                               ("--lr-warmup-samples", args.lr_warmup_samples, 0),
                               ("--lr-wsd-decay-samples", args.lr_wsd_decay_samples, None)):
        if value != unset:
            raise ConfigError(f"{flag} is for sample-based training (--train-samples); with --train-iters use "
                              f"{flag.replace('-samples', '-iters')}")


def _check_rampup(args: argparse.Namespace) -> None:
    """``--rampup-batch-size start increment samples``: what megatron-core's calculator asserts, and a global
    batch of every size on the ramp divisible into micro-batches (and, interleaved, pipeline-sized groups)."""
    if not args.rampup_batch_size:
        return
    start, increment, samples = args.rampup_batch_size
    gbs, unit = args.global_batch_size, args.micro_batch_size * args.data_parallel_size
    if start <= 0 or increment <= 0 or samples < 0:
        raise ConfigError("--rampup-batch-size: the start batch size and increment must be positive, the ramp-up "
                          "samples >= 0")
    if not start < gbs or (gbs - start) % increment:
        raise ConfigError(f"--rampup-batch-size {start} {increment} {samples}: the start batch size must be below "
                          f"--global-batch-size {gbs}, and the increment divide their difference")
    pp, vpp = args.pipeline_model_parallel_size, args.virtual_pipeline_model_parallel_size
    for size in range(start, gbs + 1, increment):
        if size % unit:
            raise ConfigError(f"--rampup-batch-size: the ramp's global batch {size} is not divisible by "
                              f"--micro-batch-size {args.micro_batch_size} x data-parallel size "
                              f"{args.data_parallel_size}")
        if vpp and (size // unit) % pp:
            raise ConfigError(f"--rampup-batch-size: the ramp's global batch {size} gives {size // unit} "
                              f"micro-batches; the interleaved pipeline needs a multiple of "
                              f"--pipeline-model-parallel-size {pp}")


def check_schedule_args(args: argparse.Namespace) -> None:
    """Raise ``ConfigError`` for flags megatron-core's scheduler cannot take; sets train_iters for --train-samples."""
    if args.override_opt_param_scheduler and args.use_checkpoint_opt_param_scheduler:
        raise ConfigError("--override-opt_param-scheduler and --use-checkpoint-opt_param-scheduler are mutually "
                          "exclusive: pass one")
    if args.micro_batch_size is None:
        raise ConfigError("--micro-batch-size is required (as in Megatron-LM)")
    if args.global_batch_size is None:  # Megatron-LM's default: one micro-batch per data-parallel rank
        args.global_batch_size = args.micro_batch_size * args.data_parallel_size
    _check_mode(args)
    if args.result_rejected_tracker_filename is not None:  # extends --iterations-to-skip (Megatron-LM)
        args.iterations_to_skip = (list(args.iterations_to_skip or [])
                                   + rejected_iterations(args.result_rejected_tracker_filename))
    if args.lr_warmup_fraction is not None:
        if args.lr_warmup_iters or args.lr_warmup_samples:
            raise ConfigError("--lr-warmup-fraction and --lr-warmup-iters/--lr-warmup-samples are mutually exclusive")
        if not 0.0 <= args.lr_warmup_fraction < 1.0:
            raise ConfigError(f"--lr-warmup-fraction must be in [0, 1), not {args.lr_warmup_fraction}")
    if args.weight_decay_incr_style == "constant":
        if args.start_weight_decay is not None or args.end_weight_decay is not None:
            raise ConfigError("--start-weight-decay/--end-weight-decay need --weight-decay-incr-style linear or cosine "
                              "(constant uses --weight-decay)")
    elif args.start_weight_decay is None or args.end_weight_decay is None:
        raise ConfigError(f"--weight-decay-incr-style {args.weight_decay_incr_style} needs --start-weight-decay and "
                          "--end-weight-decay")
    elif not 0.0 <= args.start_weight_decay <= args.end_weight_decay:
        raise ConfigError("--end-weight-decay must be >= --start-weight-decay >= 0 (megatron-core's scheduler only "
                          "increases weight decay)")
    if args.lr is not None and not 0.0 <= args.min_lr <= args.lr:
        raise ConfigError(f"--min-lr {args.min_lr} must be between 0 and --lr {args.lr}")
    if args.lr is not None and args.lr_warmup_init > args.lr:
        raise ConfigError(f"--lr-warmup-init {args.lr_warmup_init} exceeds --lr {args.lr}")
    steps = scheduler_steps(args)
    unit = "samples" if args.train_samples is not None else "iterations"
    suffix = "samples" if args.train_samples is not None else "iters"  # of the flag names
    to_unit = 1 if args.train_samples is not None else args.global_batch_size
    if steps["lr_decay_steps"] <= 0:
        raise ConfigError(f"the LR decay length must be positive (--lr-decay-{suffix}, default --train-{suffix})")
    if steps["lr_warmup_steps"] >= steps["lr_decay_steps"]:
        raise ConfigError(f"the LR warmup ({steps['lr_warmup_steps'] / to_unit:g} {unit}) must be shorter than the LR "
                          f"decay ({steps['lr_decay_steps'] / to_unit:g} {unit}, --lr-decay-{suffix})")
    wsd = steps["wsd_decay_steps"]
    if args.lr_decay_style == "WSD":
        if wsd is None:
            raise ConfigError(f"--lr-decay-style WSD needs --lr-wsd-decay-{suffix} (the length of its annealing phase)")
        if not 0 < wsd <= steps["lr_decay_steps"]:
            raise ConfigError(f"--lr-wsd-decay-{suffix} must be between 1 and the LR decay length "
                              f"({steps['lr_decay_steps'] // to_unit} {unit})")
