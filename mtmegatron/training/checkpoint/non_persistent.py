"""Megatron-LM's non-persistent checkpoints: frequent saves that are not kept.

``--non-persistent-save-interval N --non-persistent-ckpt-type global`` saves every N iterations that are not a
``--save-interval`` iteration into ``--non-persistent-global-ckpt-dir`` (default ``<save>/non_persistent``), in
the same torch_dist layout as persistent checkpoints and as atomically (training/checkpoint/checkpointing.py: written to
``iter_N.partial``, renamed, then the tracker replaced); only then are the older non-persistent checkpoints
removed, so the newest complete one is on disk at every moment (Megatron-LM removes all but the newest before
it writes the next one, so between saves it keeps two). With ``--non-persistent-ckpt-type global``, ``--load``
takes the newer of the persistent checkpoint under ``<load>`` and the non-persistent one under
``--non-persistent-global-ckpt-dir`` (default ``<load>/non_persistent``); on a tie the non-persistent one, as
Megatron-LM does (utils/checkpoint_dirs.py ``resume_point``). ``local`` (nvidia-resiliency-ext's node-local
checkpoints) and ``in_memory`` are refused (config/resilience_flags.py).
May assume: the flags were checked (resilience_flags.py); process groups and the model/optimizer exist when saving.
"""

from __future__ import annotations

import os

from mtmegatron.training.checkpoint.section import Checkpoint
from mtmegatron.utils.checkpoint_dirs import non_persistent_dir


def directory(checkpoint: Checkpoint, root: str) -> str:
    """Where the non-persistent checkpoints of ``root`` (``--save`` when saving, ``--load`` when loading) are;
    nothing is removed before a save: it prunes the older ones once the new one is tracked (``kept``)."""
    return non_persistent_dir(checkpoint, root)


def due(checkpoint: Checkpoint, iteration: int) -> bool:
    interval = checkpoint.non_persistent_save_interval
    return bool(checkpoint.save and interval and iteration % interval == 0)


def kept(checkpoint: Checkpoint, root: str) -> int | None:
    """How many complete checkpoints a save into ``root`` leaves there: one in the non-persistent directory,
    else ``--keep-last`` (None: all)."""
    if checkpoint.save and checkpoint.non_persistent_ckpt_type == "global" and (
            os.path.realpath(root) == os.path.realpath(directory(checkpoint, checkpoint.save))):
        return 1
    return checkpoint.keep_last


def startup_lines(checkpoint: Checkpoint) -> list[str]:
    """What the non-persistent and persistent-worker flags do in this run (nothing when not given)."""
    lines = []
    if due(checkpoint, checkpoint.non_persistent_save_interval or 0):
        lines.append(f"mtmegatron: non-persistent checkpoints every {checkpoint.non_persistent_save_interval} "
                     f"iterations in {directory(checkpoint, checkpoint.save)} (only the newest kept)")
    if checkpoint.use_persistent_ckpt_worker:
        lines.append("mtmegatron: --use-persistent-ckpt-worker: no effect: it keeps megatron-core's --async-save "
                     "worker process alive between saves, and saves here are synchronous (--async-save is refused)")
    return lines
