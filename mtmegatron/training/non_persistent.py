"""Megatron-LM's non-persistent checkpoints: frequent saves that are not kept.

``--non-persistent-save-interval N --non-persistent-ckpt-type global`` saves every N iterations that are not a
``--save-interval`` iteration into ``--non-persistent-global-ckpt-dir`` (default ``<save>/non_persistent``), in
the same torch_dist layout as persistent checkpoints (training/checkpointing.py), removing the older
non-persistent checkpoints first so that only the newest is kept. With ``--non-persistent-ckpt-type global``,
``--load`` takes the newer of the persistent checkpoint under ``<load>`` and the non-persistent one under
``--non-persistent-global-ckpt-dir`` (default ``<load>/non_persistent``); on a tie the non-persistent one, as
Megatron-LM does. ``local`` (nvidia-resiliency-ext's node-local checkpoints) and ``in_memory`` are refused
(training/resilience_flags.py).
May assume: the flags were checked (resilience_flags.py); process groups and the model/optimizer exist when saving.
"""

from __future__ import annotations

import os

SUBDIR = "non_persistent"  # Megatron-LM's _NON_PERSISTENT_CKPT_SUBDIR


def directory(args, root: str) -> str:
    return args.non_persistent_global_ckpt_dir or os.path.join(root, SUBDIR)


def due(args, iteration: int) -> bool:
    interval = args.non_persistent_save_interval
    return bool(args.save and interval and iteration % interval == 0)


def fresh_root(args) -> str:
    """The directory a non-persistent save goes into, emptied of the kept one (Megatron-LM removes the old ones
    first); the caller saves there."""
    import shutil

    import torch

    root = directory(args, args.save)
    if torch.distributed.get_rank() == 0 and os.path.isdir(root):
        for name in os.listdir(root):
            if name.startswith("iter_"):
                shutil.rmtree(os.path.join(root, name), ignore_errors=True)
    return root


def load_root(args, root: str) -> str:
    """The directory ``--load`` reads: the non-persistent one when its checkpoint is at least as new."""
    if args.non_persistent_ckpt_type != "global":
        return root
    from mtmegatron.utils.checkpoint_dirs import latest_complete_iteration

    candidate = directory(args, root)
    newest = latest_complete_iteration(candidate)
    if newest is None:
        return root
    persistent = latest_complete_iteration(root)
    return candidate if persistent is None or newest >= persistent else root


def startup_lines(args) -> list[str]:
    """What the non-persistent and persistent-worker flags do in this run (nothing when not given)."""
    lines = []
    if due(args, args.non_persistent_save_interval or 0):
        lines.append(f"mtmegatron: non-persistent checkpoints every {args.non_persistent_save_interval} iterations "
                     f"in {directory(args, args.save)} (only the newest kept)")
    if args.use_persistent_ckpt_worker:
        lines.append("mtmegatron: --use-persistent-ckpt-worker: no effect: it keeps megatron-core's --async-save "
                     "worker process alive between saves, and saves here are synchronous (--async-save is refused)")
    return lines
