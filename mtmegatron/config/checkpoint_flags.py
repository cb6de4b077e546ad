"""Megatron-LM's checkpoint flags, honoured by training/checkpoint/checkpointing.py with Megatron-LM's defaults.

Registered by hand (option strings, dests, actions, choices and defaults as Megatron-LM core_v0.16.1's parser
has them) and validated in ``check_checkpoint_args``: ``--ckpt-format`` (``torch_dist`` only; the others are
refused with the reason), ``--async-save`` (refused: see ASYNC_REFUSAL), ``--no-save-optim``, ``--no-save-rng``,
``--use-checkpoint-args``, ``--no-ckpt-fully-parallel-save`` (fully parallel save is Megatron-LM's default),
``--ckpt-fully-parallel-load``, ``--dist-ckpt-strictness``, ``--ckpt-assume-constant-structure``,
``--auto-detect-ckpt-format``, ``--dist-ckpt-optim-fully-reshardable`` (always the case here),
``--non-persistent-save-interval`` (training/checkpoint/non_persistent.py), ``--exit-on-missing-checkpoint``,
``--ckpt-convert-format``/``--ckpt-convert-save`` (torch_dist only, ``check_convert_args``; the conversion itself
is in pretrain.py), ``--moe-use-upcycling`` (``check_upcycling_args``; the upcycling itself is
training/checkpoint/upcycling.py's). Each check is its own entry of arguments.CHECKS.
``check_checkpoint_paths`` (training only) checks ``--save``/``--load`` on disk (checkpoint_dirs.py).
``use_checkpoint_args`` runs at parse time, before the model fields are derived: it reads the ``--load``
checkpoint's saved Namespace (training/checkpoint/megatron_lm_checkpoint.py).
May assume: argparse only at registration; megatron-core importable when --use-checkpoint-args reads a checkpoint.
"""

from __future__ import annotations

import argparse
import os

from mtmegatron.utils.checkpoint_dirs import FORMAT_REFUSALS
from mtmegatron.utils.errors import ConfigError

STRICTNESS = ("assume_ok_unexpected", "log_unexpected", "log_all", "raise_unexpected", "raise_all",
              "return_unexpected", "return_all", "ignore_all")
ASYNC_REFUSAL = ("--async-save: not supported by mtmegatron's checkpointing yet (a save is finished — every "
                 "rank's shard written, the iter_* directory renamed from .partial and the tracker replaced — "
                 "before training continues); drop the flag")


def add_checkpoint_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("checkpoint format and loading (Megatron-LM's; see docs/checkpoints.md)")
    g.add_argument("--ckpt-format", default="torch_dist", choices=["torch", "torch_dist", "torch_dcp", "fsdp_dtensor"],
                   help="checkpoint format: torch_dist (megatron-core dist_checkpointing, the only one here)")
    g.add_argument("--auto-detect-ckpt-format", action="store_true",
                   help="detect the format of the --load checkpoint (here: anything but torch_dist is refused "
                        "with its format named)")
    g.add_argument("--async-save", action="store_true", help="save in the background (refused here: see docs)")
    g.add_argument("--no-save-optim", action="store_true", default=None,
                   help="do not save the optimizer and scheduler state")
    g.add_argument("--no-save-rng", action="store_true", default=None, help="do not save the RNG states")
    g.add_argument("--use-checkpoint-args", action="store_true",
                   help="take the model's shape flags from the --load checkpoint's saved args (Megatron-LM's "
                        "or ours)")
    g.add_argument("--no-ckpt-fully-parallel-save", "--disable-ckpt-fully-parallel-save",
                   dest="ckpt_fully_parallel_save", action="store_false", default=True,
                   help="every data-parallel replica writes the whole of its shard (default: the writing is "
                        "spread over the data-parallel ranks)")
    g.add_argument("--ckpt-fully-parallel-load", action="store_true",
                   help="spread the reading over the data-parallel ranks and exchange the pieces")
    g.add_argument("--dist-ckpt-strictness", default="assume_ok_unexpected", choices=STRICTNESS,
                   help="what a load does about keys missing from, or unexpected in, the checkpoint "
                        "(megatron-core's StrictHandling)")
    g.add_argument("--ckpt-assume-constant-structure", action="store_true",
                   help="reuse the first save's plan for later saves of this run (the model/optimizer structure "
                        "must not change)")
    g.add_argument("--dist-ckpt-optim-fully-reshardable", action="store_true",
                   help="store the distributed optimizer in megatron-core's fully reshardable format (always so "
                        "here: a checkpoint loads under any TP/PP/DP layout)")
    g.add_argument("--exit-on-missing-checkpoint", action="store_true",
                   help="with --load: exit (status 2) when it holds no checkpoint, instead of starting from "
                        "scratch")
    g.add_argument("--non-persistent-save-interval", type=int, default=None,
                   help="save a checkpoint that is not kept every N iterations (with --non-persistent-ckpt-type "
                        "global; training/checkpoint/non_persistent.py)")


def check_checkpoint_args(args: argparse.Namespace) -> None:
    if args.ckpt_format != "torch_dist":
        raise ConfigError(f"--ckpt-format {args.ckpt_format}: {FORMAT_REFUSALS[args.ckpt_format]}")
    if args.async_save:
        raise ConfigError(ASYNC_REFUSAL)


def check_convert_args(args: argparse.Namespace) -> None:
    """``--ckpt-convert-format``: load ``--load``, save it to ``<--ckpt-convert-save>/<format>`` and exit
    (pretrain.py ``run``); as Megatron-LM it needs both directories and a checkpoint to load."""
    fmt = args.ckpt_convert_format
    if fmt is None:
        return
    if fmt != "torch_dist":
        raise ConfigError(f"--ckpt-convert-format {fmt}: mtmegatron does not write {fmt} checkpoints "
                          f"({FORMAT_REFUSALS[fmt]})")
    if not args.ckpt_convert_save:
        raise ConfigError("--ckpt-convert-format needs --ckpt-convert-save DIR (the checkpoint is written to "
                          "DIR/torch_dist)")
    if not args.load:
        raise ConfigError("--ckpt-convert-format needs --load DIR (the checkpoint to convert)")
    args.exit_on_missing_checkpoint = True  # as Megatron-LM: nothing to convert is an error


def check_upcycling_args(args: argparse.Namespace) -> None:
    """``--moe-use-upcycling`` (training/checkpoint/upcycling.py): ``--save`` given and empty, ``--load`` and
    ``--num-experts`` given; ``--no-load-optim`` / ``--no-load-rng`` forced (with a start-up note,
    ``args.upcycling_note``)."""
    args.upcycling_note = None
    if not args.moe_use_upcycling:
        return
    if not args.save:
        raise ConfigError("--moe-use-upcycling needs --save DIR (the upcycled MoE checkpoint is written there)")
    from mtmegatron.utils.checkpoint_dirs import latest_complete_iteration

    try:
        saved = latest_complete_iteration(args.save)
    except Exception:
        saved = None
    if saved is not None:
        raise ConfigError(f"--moe-use-upcycling: --save {args.save} already holds a checkpoint (iteration {saved}); "
                          f"upcycling is only for the first run from the dense model: drop the flag to continue")
    if not args.load:
        raise ConfigError("--moe-use-upcycling needs --load DIR (the dense model's checkpoint)")
    if not args.num_experts:
        raise ConfigError("--moe-use-upcycling needs --num-experts (the MoE model the dense checkpoint becomes)")
    if not (args.no_load_optim and args.no_load_rng):
        args.upcycling_note = ("--moe-use-upcycling: --no-load-optim and --no-load-rng forced (the dense "
                               "checkpoint's optimizer and RNG states do not fit the MoE model), as Megatron-LM")
    args.no_load_optim = True
    args.no_load_rng = True


def check_checkpoint_paths(args: argparse.Namespace) -> None:
    """A training run's ``--save`` and ``--load`` as they are on disk, before any process group starts."""
    from mtmegatron.utils.checkpoint_dirs import check_paths

    check_paths(args, ConfigError)
    if args.ckpt_convert_format:
        from mtmegatron.utils.checkpoint_dirs import check_writable_dir

        check_writable_dir("--ckpt-convert-save", args.ckpt_convert_save, ConfigError)


def use_checkpoint_args(args: argparse.Namespace, given: dict) -> None:
    """``--use-checkpoint-args``: the model fields of ``args`` from the ``--load`` checkpoint's saved Namespace
    (before the derived sizes are computed). A checkpoint without a Namespace (an mtmegatron checkpoint of an
    older layout, or a converter's) is an error naming why."""
    if not args.use_checkpoint_args:
        return
    if not args.load:
        raise ConfigError("--use-checkpoint-args needs --load DIR (the checkpoint whose saved args to use)")
    from mtmegatron.training.checkpoint import megatron_lm_checkpoint as mlm
    from mtmegatron.utils.checkpoint_dirs import CheckpointError, checkpoint_dir, resume_point

    try:
        point = resume_point(args.load, args)  # the checkpoint the run will load (maybe the non-persistent one)
    except CheckpointError as e:
        raise ConfigError(str(e)) from None
    if point is None:
        raise ConfigError(f"--use-checkpoint-args: no complete checkpoint under --load {args.load}")
    from megatron.core import dist_checkpointing

    common = dist_checkpointing.load_common_state_dict(checkpoint_dir(*point))
    if not mlm.is_megatron_lm_layout(common):
        raise ConfigError(f"--use-checkpoint-args: {checkpoint_dir(*point)} holds no saved argument "
                          f"Namespace (written by an older mtmegatron or the converter): give the model flags")
    args.checkpoint_args_applied = mlm.apply_checkpoint_args(args, common["args"], given,
                                                             ours=not mlm.written_by_megatron_lm(common))
    if int(os.environ.get("RANK", "0")) == 0 and args.checkpoint_args_applied:
        print(f"mtmegatron: --use-checkpoint-args: from {args.load}: {', '.join(args.checkpoint_args_applied)}",
              flush=True)
