"""Validation of Megatron-LM's resilience flags, before any process group starts: ``--rerun-mode`` (its
``report_stats`` choice is refused: megatron-core 0.16.1 cannot run it) and the non-persistent checkpoint flags
(``local`` and ``in_memory`` refused with the reason; an interval needs ``--non-persistent-ckpt-type global``
and ``--save``; ``--non-persistent-global-ckpt-dir`` may not be the ``--save`` directory, whose persistent
checkpoints its pruning would remove). What the accepted values do: training/resilience/rerun.py and training/checkpoint/non_persistent.py.
May assume: argparse only.
"""

from __future__ import annotations

import os

from mtmegatron.utils.errors import ConfigError

REPORT_STATS_REFUSAL = ("--rerun-mode report_stats: megatron-core 0.16.1 cannot run it (Megatron-LM 0.16.1 passes "
                        "'report_stats' to RerunMode, which has no such value, and megatron-core's determinism "
                        "report reads Caller.filename, which Caller lacks); use validate_results or disabled")
LOCAL_REFUSAL = ("--non-persistent-ckpt-type local: nvidia-resiliency-ext's local checkpoint manager is not wired "
                 "into mtmegatron's checkpointing (nor can it hold the fully reshardable distributed-optimizer state "
                 "saved here, Megatron-LM 0.16 refuses that too); use --non-persistent-ckpt-type global")
IN_MEMORY_REFUSAL = ("--non-persistent-ckpt-type in_memory: not supported by Megatron-LM 0.16 either (only global "
                     "and local); use --non-persistent-ckpt-type global")


def check_resilience_args(args) -> None:
    if args.rerun_mode == "report_stats":
        raise ConfigError(REPORT_STATS_REFUSAL)
    kind = args.non_persistent_ckpt_type
    if kind == "local":
        raise ConfigError(LOCAL_REFUSAL)
    if kind == "in_memory":
        raise ConfigError(IN_MEMORY_REFUSAL)
    if args.non_persistent_save_interval is not None:
        if args.non_persistent_save_interval <= 0:
            raise ConfigError(f"--non-persistent-save-interval {args.non_persistent_save_interval}: must be positive")
        if kind is None:
            raise ConfigError("--non-persistent-save-interval needs --non-persistent-ckpt-type global (where to save; "
                              "Megatron-LM fails at the first such save without it)")
        if not args.save:
            raise ConfigError("--non-persistent-save-interval needs --save DIR (non-persistent checkpoints go to "
                              "--non-persistent-global-ckpt-dir, default DIR/non_persistent)")
    custom = args.non_persistent_global_ckpt_dir
    if kind == "global" and custom and args.save and os.path.realpath(custom) == os.path.realpath(args.save):
        raise ConfigError(f"--non-persistent-global-ckpt-dir {custom} is the --save directory: each non-persistent "
                          f"save keeps only the newest checkpoint there, so it would remove the persistent ones; "
                          f"give another directory (default {os.path.join(args.save, 'non_persistent')})")
