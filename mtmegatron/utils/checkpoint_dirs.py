"""A checkpoint root on disk (the tracker file, ``iter_*`` directories, debris of interrupted saves), read with
``os`` only, and the checks of ``--save``/``--load`` that run before any process group starts.

Layout (Megatron-LM's): ``<root>/iter_0000010/`` (complete once ``metadata.json`` is in it and it is no longer
``.partial``) and ``<root>/latest_checkpointed_iteration.txt`` naming the newest; non-persistent checkpoints
(``--non-persistent-ckpt-type global``) in the same layout under ``<root>/non_persistent`` or
``--non-persistent-global-ckpt-dir``. ``resume_point`` says which checkpoint ``--load`` resumes (the newer
complete one of the two; a tie goes to the non-persistent one). ``check_paths`` refuses, with one
``ConfigError`` line each: a ``--save`` or ``--load`` that is a file, a ``--save`` that cannot be created or
written (``check_writable_dir``, also used for ``--log-dir``), a ``--load`` directory that does not exist
(unless it is the ``--save`` directory: the first run of ``--save X --load X``), a tracker (persistent or
non-persistent) naming an iteration whose checkpoint is missing or incomplete (the complete ones of both are
listed), debris without a complete checkpoint, non-persistent checkpoints only while
``--non-persistent-ckpt-type global`` is not given, ``--finetune`` or ``--exit-on-missing-checkpoint`` without
a checkpoint. Only a directory holding nothing a save writes starts from scratch (Megatron-LM).
May assume: nothing beyond ``os`` (imported at flag validation, before torch or megatron-core).
"""

from __future__ import annotations

import os
import re

TRACKER = "latest_checkpointed_iteration.txt"
NON_PERSISTENT_SUBDIR = "non_persistent"  # Megatron-LM's _NON_PERSISTENT_CKPT_SUBDIR
_ITER_DIR = re.compile(r"^iter_(\d{7})$")


class CheckpointError(ValueError):
    """A checkpoint that cannot be used as asked (missing, corrupt, other model); the message says why."""


FORMAT_REFUSALS = {
    "torch": "the legacy per-rank torch.save format (mp_rank_*/model_optim_rng.pt) is not written or read here; "
             "convert with Megatron-LM's --ckpt-convert-format torch_dist, or use --ckpt-format torch_dist",
    "torch_dcp": "plain torch.distributed.checkpoint state dicts (Megatron-LM's FSDP2 path) are not supported; "
                 "use --ckpt-format torch_dist",
    "fsdp_dtensor": "Megatron FSDP's DTensor format is not written or read here (megatron-core 0.16.1's writer "
                    "of it fails on its own GPT models: handle_swiglu_in_state_dict asks MegatronFSDP for "
                    "'decoder'); --use-megatron-fsdp checkpoints in torch_dist, the same logical checkpoint as "
                    "DDP's: use --ckpt-format torch_dist",
}

def checkpoint_dir(root: str, iteration: int) -> str:
    return os.path.join(root, f"iter_{iteration:07d}")


def latest_iteration(root: str) -> int | None:
    tracker = os.path.join(root, TRACKER)
    if not os.path.isfile(tracker):
        return None
    with open(tracker) as f:
        text = f.read().strip()
    if not text.isdigit():
        raise CheckpointError(f"{tracker} is corrupt (expected an iteration number, found {text!r})")
    return int(text)


def is_complete(directory: str) -> bool:
    # dist_checkpointing writes metadata.json last; the rename from .partial happens after every rank finished
    return os.path.isfile(os.path.join(directory, "metadata.json"))


def complete_iterations(root: str) -> list[int]:
    """Iterations of the complete checkpoints under ``root``, oldest first (``.partial`` ones never count)."""
    if not os.path.isdir(root):
        return []
    found = [int(m.group(1)) for name in os.listdir(root) if (m := _ITER_DIR.match(name))]
    return sorted(it for it in found if is_complete(checkpoint_dir(root, it)))


def _describe_complete(roots: list[str]) -> str:
    found = [checkpoint_dir(root, it) for root in dict.fromkeys(roots) for it in complete_iterations(root)]
    return ", ".join(found) if found else "none"


def _refuse_tracker(root: str, tracked: int, load: str, listed: list[str]) -> None:
    directory = checkpoint_dir(root, tracked)
    state = "is incomplete (an interrupted save)" if os.path.isdir(directory) else "is missing"
    complete = _describe_complete(listed)
    advice = (f"to resume from one, write its iteration into its directory's {TRACKER}, and remove a tracker "
              f"whose checkpoint is gone" if complete != "none" else
              f"remove {os.path.join(root, TRACKER)} and the iter_* debris to start from scratch, or pass another "
              f"--load")
    raise CheckpointError(f"--load {load}: {os.path.join(root, TRACKER)} names iteration {tracked} but "
                          f"{directory} {state}; complete checkpoints: {complete} ({advice})")


def latest_complete_iteration(root: str, also_list: tuple[str, ...] = (), load: str | None = None) -> int | None:
    """The tracker's iteration, else (no tracker: a tracker lost in a crash or removed by hand) the newest
    complete checkpoint, else None. A tracker naming a checkpoint that is missing or incomplete is an error
    listing the complete ones (here and under ``also_list``): loading another iteration than the one named
    would resume silently from an older point, and starting from scratch would drop the ones on disk. ``load``:
    the ``--load`` directory the message names (default ``root``)."""
    tracked = latest_iteration(root)
    if tracked is None:
        complete = complete_iterations(root)
        return complete[-1] if complete else None
    if is_complete(checkpoint_dir(root, tracked)):
        return tracked
    _refuse_tracker(root, tracked, load or root, [root, *also_list])


def non_persistent_dir(args, root: str) -> str:
    """Where Megatron-LM keeps the non-persistent checkpoints of ``root`` (``--save`` or ``--load``):
    ``--non-persistent-global-ckpt-dir``, else ``<root>/non_persistent``."""
    return args.non_persistent_global_ckpt_dir or os.path.join(root, NON_PERSISTENT_SUBDIR)


def resume_point(load: str, args) -> tuple[str, int] | None:
    """``(directory, iteration)`` that ``--load`` resumes: the newer complete checkpoint of the persistent one
    under ``load`` and, with ``--non-persistent-ckpt-type global``, the non-persistent one (on a tie the
    non-persistent one, as Megatron-LM); None when neither holds one. A tracker in either naming a missing or
    incomplete checkpoint is a CheckpointError listing the complete checkpoints of both."""
    if args.non_persistent_ckpt_type != "global":
        iteration = latest_complete_iteration(load)
        return None if iteration is None else (load, iteration)
    other = non_persistent_dir(args, load)
    persistent = latest_complete_iteration(load, (other,))
    newest = latest_complete_iteration(other, (load,), load)
    if newest is not None and (persistent is None or newest >= persistent):
        return other, newest
    return None if persistent is None else (load, persistent)


def checkpoint_debris(root: str) -> list[str]:
    """Entries of ``root`` that a save leaves (tracker, ``iter_*``, ``*.partial``): none means a fresh start."""
    if not os.path.isdir(root):
        return []
    return sorted(name for name in os.listdir(root)
                  if name.startswith(TRACKER) or name.startswith("iter_") or name.endswith(".partial"))


def _same_path(a: str | None, b: str | None) -> bool:
    return bool(a and b) and os.path.realpath(a) == os.path.realpath(b)


def check_writable_dir(flag: str, path: str, error: type[Exception], what: str = "a directory") -> None:
    """``path`` is a writable directory, or one that can be created; else ``error`` naming ``flag``."""
    if os.path.exists(path):
        if not os.path.isdir(path):
            raise error(f"{flag} {path} is a file, not a directory: name {what}")
        if not os.access(path, os.W_OK | os.X_OK):
            raise error(f"{flag} {path}: the directory is not writable")
        return
    parent = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise error(f"{flag} {path} cannot be created: {parent} is a file")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise error(f"{flag} {path} cannot be created: {parent} is not writable")


def _no_checkpoint_reason(args) -> str | None:
    if args.finetune:
        return "--finetune needs one"
    if args.exit_on_missing_checkpoint:
        return "--exit-on-missing-checkpoint"
    return None


def check_load(load: str, args, error: type[Exception]) -> None:
    """``--load`` ``load``: a checkpoint to resume, or a fresh start Megatron-LM would make; else ``error``."""
    if os.path.exists(load) and not os.path.isdir(load):
        raise error(f"--load {load} is a file, not a checkpoint directory (the directory holding "
                    f"{TRACKER} and iter_*/)")
    if not os.path.isdir(load):
        if _same_path(load, args.save) and _no_checkpoint_reason(args) is None:
            return  # the first run of `--save X --load X`
        reason = _no_checkpoint_reason(args)
        raise error(f"--load {load}: no such directory, so no checkpoint to resume"
                    f"{' (' + reason + ')' if reason else ''}; to start from scratch drop --load (or give the "
                    f"--save directory, which a first run may not have created yet)")
    if not os.access(load, os.R_OK | os.X_OK):
        raise error(f"--load {load}: the directory is not readable")
    try:
        tracked = latest_iteration(load)
        foreign = foreign_format(checkpoint_dir(load, tracked)) if tracked is not None else None
        if foreign:
            raise error(f"--load {load}: {checkpoint_dir(load, tracked)} is a '{foreign}' checkpoint: "
                        f"{FORMAT_REFUSALS[foreign]}")
        if resume_point(load, args) is not None:
            return
        other = non_persistent_dir(args, load)
        unread = complete_iterations(other) if args.non_persistent_ckpt_type != "global" else []
        if unread:  # Megatron-LM would start from scratch (it reads them only with the flag)
            raise error(f"--load {load}: no persistent checkpoint, but {other} holds the non-persistent checkpoint "
                        f"of iteration {unread[-1]}: pass --non-persistent-ckpt-type global to resume from it, or "
                        f"remove {other} to start from scratch")
        debris = checkpoint_debris(load) + [os.path.relpath(os.path.join(other, name), load)
                                            for name in checkpoint_debris(other)]
    except CheckpointError as e:
        raise error(str(e)) from None
    reason = _no_checkpoint_reason(args)
    if debris or reason:
        found = f"it holds {', '.join(debris[:3])}{' ...' if len(debris) > 3 else ''} but" if debris else "there is"
        raise error(f"--load {load}: {found} no complete checkpoint (no {TRACKER} naming a finished iter_* "
                    f"directory){'; ' + reason if reason else ''}; "
                    + ("remove the debris of the interrupted save to start from scratch, or pass another --load"
                       if debris else "pass the directory of a saved run"))


def foreign_format(directory: str) -> str | None:
    """The format of a checkpoint directory that is not torch_dist (Megatron-LM's other formats), else None."""
    if not os.path.isdir(directory) or is_complete(directory):
        return None
    names = os.listdir(directory)
    if any(name.startswith("mp_rank_") for name in names):
        return "torch"
    if ".metadata" in names:
        return "torch_dcp"
    return None


def check_paths(args, error: type[Exception]) -> None:
    """``--save`` and ``--load`` usable as the run will use them (see the module docstring)."""
    if args.save:
        check_writable_dir("--save", args.save, error, f"a directory (checkpoints are iter_*/ and {TRACKER})")
    if args.load:
        check_load(args.load, args, error)
