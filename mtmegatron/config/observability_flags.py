"""Logging, timing, profiling, wandb and garbage-collection flags of ``mtmegatron.pretrain`` (Megatron-LM
0.16.1's option strings, dests, types and defaults) and their rules.

What they do is in training/observability/run_hooks.py (and throughput.py, step_timers.py, profiler.py, wandb_log.py,
params_norm.py). ``--profile`` without ``--use-pytorch-profiler`` is Megatron-LM's nsys range on the CUDA
backend (cudaProfilerStart/Stop around the steps, NVTX ranges); on the other backends it writes the torch
profiler trace instead and says so at start-up.
May assume: called by arguments.build_parser / arguments.CHECKS only.
"""

from __future__ import annotations

import argparse

from mtmegatron.utils.errors import ConfigError

WANDB_EXTRA = "pip install 'mtmegatron[wandb]'"


def add_observability_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("logging, timers, profiling (see docs/observability.md)")
    g.add_argument("--log-throughput", action="store_true",
                   help="log model TFLOP/s per device (Megatron-LM's FLOP formula) and MFU where the device's "
                        "bf16 peak is known")
    g.add_argument("--log-params-norm", action="store_true", help="log the L2 norm of all parameters")
    g.add_argument("--log-num-zeros-in-grad", action="store_true",
                   help="log the number of zeros in the gradients (megatron-core's optimizer counts them)")
    g.add_argument("--timing-log-level", type=int, choices=[0, 1, 2], default=0,
                   help="0: iteration time only; 1: also per-step phases (forward-backward, gradient sync, "
                        "optimizer parts); 2: also per micro-batch ones (batch-generator, forward/backward compute, "
                        "pipeline send/recv); levels 1-2 synchronise the device and may slow steps")
    g.add_argument("--timing-log-option", type=str, choices=["max", "minmax", "all"], default="minmax",
                   help="timers over ranks: the max, the min and max, or every rank")
    g.add_argument("--no-barrier-with-level-1-timing", dest="barrier_with_L1_time", action="store_false",
                   help="level-1 timers start without a barrier over the ranks")
    g.add_argument("--log-timers-to-tensorboard", action="store_true",
                   help="write the timers (max over ranks, seconds per iteration) to tensorboard/metrics")
    g.add_argument("--log-memory-to-tensorboard", action="store_true",
                   help="write device memory statistics (cpu backend: the process RSS) to tensorboard/metrics")
    g.add_argument("--log-world-size-to-tensorboard", action="store_true",
                   help="write the world size to tensorboard/metrics")
    g.add_argument("--log-validation-ppl-to-tensorboard", action="store_true",
                   help="write the validation perplexity exp(min(20, loss)) to tensorboard/metrics")
    g.add_argument("--tensorboard-log-interval", type=int, default=1, help="write tensorboard every N iterations")
    g.add_argument("--tensorboard-queue-size", type=int, default=1000,
                   help="tensorboard events held in memory before a write to disk")
    g.add_argument("--wandb-project", type=str, default=None,
                   help=f"log the metrics rows to this Weights & Biases project (needs {WANDB_EXTRA}; "
                        "WANDB_MODE=offline works without network)")
    g.add_argument("--wandb-exp-name", type=str, default=None, help="the wandb run name")
    g.add_argument("--wandb-save-dir", type=str, default=None,
                   help="local wandb directory (default: <save>/wandb, or <log-dir>/wandb without --save)")
    g.add_argument("--wandb-entity", type=str, default=None, help="the wandb entity (team or user)")
    g.add_argument("--profile", action="store_true",
                   help="profile steps --profile-step-start..--profile-step-end on --profile-ranks (CUDA: nsys "
                        "range as Megatron-LM; other backends: torch profiler trace)")
    g.add_argument("--profile-step-start", type=int, default=10, help="first profiled iteration")
    g.add_argument("--profile-step-end", type=int, default=12, help="profiling stops after this iteration")
    g.add_argument("--profile-ranks", nargs="+", type=int, default=[0], help="global ranks to profile")
    g.add_argument("--use-pytorch-profiler", action="store_true",
                   help="torch.profiler chrome trace (CPU + device activity) into the tensorboard directory")
    g.add_argument("--manual-gc", action="store_true",
                   help="disable Python's automatic garbage collection; collect at --manual-gc-interval and "
                        "around validation, at the same step on every rank")
    g.add_argument("--manual-gc-interval", type=int, default=0,
                   help="with --manual-gc: collect every N iterations (0: only around validation)")
    g.add_argument("--no-manual-gc-eval", "--disable-manual-gc-eval", dest="manual_gc_eval", action="store_false",
                   help="with --manual-gc: no collection before and after validation")


def check_observability_args(args: argparse.Namespace) -> None:
    """Megatron-LM's rules for these flags, each as one message."""
    if args.tensorboard_log_interval < 1:
        raise ConfigError(f"--tensorboard-log-interval must be >= 1, not {args.tensorboard_log_interval}")
    if args.tensorboard_queue_size < 1:
        raise ConfigError(f"--tensorboard-queue-size must be >= 1, not {args.tensorboard_queue_size}")
    if args.manual_gc_interval < 0:
        raise ConfigError(f"--manual-gc-interval must be >= 0, not {args.manual_gc_interval}")
    if args.profile:
        if args.profile_step_start < 0:
            raise ConfigError(f"--profile-step-start must be >= 0, not {args.profile_step_start}")
        if args.profile_step_end <= args.profile_step_start:
            raise ConfigError(f"--profile-step-end {args.profile_step_end} must be after --profile-step-start "
                              f"{args.profile_step_start}")
    if args.wandb_project:
        try:
            import wandb  # noqa: F401
        except ImportError:
            raise ConfigError(f"--wandb-project needs wandb, which is an optional extra: {WANDB_EXTRA}") from None
