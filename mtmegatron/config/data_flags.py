"""Data flags of ``mtmegatron.pretrain`` with Megatron-LM's meaning: separate blends per split, document
boundaries (EOD loss mask, position-id and attention-mask resets), data-loader workers, mmap of ``.bin`` files.

``--train-data-path/--valid-data-path/--test-data-path`` are megatron-core's ``blend_per_split`` (each a prefix,
``P1 P2 ...`` or ``W1 P1 W2 P2 ...``, like ``--data-path``); they exclude ``--data-path`` and ``--split``
(megatron-core refuses split with per-split blends). ``--split`` keeps Megatron-LM's default: None, and
``969, 30, 1`` when ``--data-path`` (or the embedded corpus, which stands for it) is read without it. The three
document flags go to megatron-core's ``GPTDatasetConfig`` as in Megatron-LM's ``pretrain_gpt.py``; ``--reset-attention-mask`` also makes the dataset
build the attention mask, which the forward step then passes to the model (without it the mask is the causal
mask type, so none is built or passed; ``--no-create-attention-mask-in-dataloader`` builds none at all, as in
Megatron-LM).
The per-split blends, the samples asked of each split and the splits a ``--split`` share leaves empty are
data/splits.py's.
May assume: ``--data-path``, ``--split``, ``--mock-data`` registered by config/run_args.py; runs inside
arguments.validate (before any process group).
"""

from __future__ import annotations

import argparse

from mtmegatron.data.section import Splits
from mtmegatron.data.splits import get_blend, per_split_paths
from mtmegatron.models import families

LEGACY_DEFAULT_SPLIT = "969, 30, 1"  # Megatron-LM's value when --data-path comes without --split


def add_data_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("data: per-split blends, document boundaries, loader")
    for split in ("train", "valid", "test"):
        g.add_argument(f"--{split}-data-path", nargs="*", default=None,
                       help=f"the {split} split's own prefix or weighted blend 'W1 P1 W2 P2 ...' (instead of "
                            "--data-path and --split)")
    g.add_argument("--num-workers", type=int, default=2,
                   help="data-loader worker processes per model chunk (0: read in the training process)")
    g.add_argument("--eod-mask-loss", action="store_true", help="no loss on end-of-document tokens")
    g.add_argument("--reset-position-ids", action="store_true",
                   help="position ids restart at 0 after each end-of-document token")
    g.add_argument("--reset-attention-mask", action="store_true",
                   help="tokens attend only within their document (block-diagonal causal mask)")
    g.add_argument("--no-mmap-bin-files", dest="mmap_bin_files", action="store_false",
                   help="read the .bin token files with file reads instead of mmap")
    g.add_argument("--no-create-attention-mask-in-dataloader", dest="create_attention_mask_in_dataloader",
                   action="store_false",
                   help="the dataset builds no attention mask, so --reset-attention-mask does not reach attention")


def check_data_args(args: argparse.Namespace, error) -> None:
    per_split = per_split_paths(Splits.of(args))
    if args.mock_data + bool(args.data_path) + bool(per_split) > 1:
        raise error("--mock-data, --data-path and --train/valid/test-data-path are mutually exclusive: give one "
                    "data source")
    if per_split:
        if not args.train_data_path:
            raise error("--valid-data-path/--test-data-path need --train-data-path (the training split's data)")
        if args.split is not None:
            raise error("--split divides --data-path; it cannot be combined with --train/valid/test-data-path")
    elif args.split is None and not args.mock_data:  # --data-path, or the embedded corpus that stands for it
        args.split = LEGACY_DEFAULT_SPLIT
    if args.num_workers < 0:
        raise error(f"--num-workers must be >= 0, not {args.num_workers}")
    _check_validation_flags(args, error)
    if args.reset_attention_mask and args.context_parallel_size > 1:
        raise error("--reset-attention-mask needs an explicit attention mask, which context parallelism does not "
                    "take here; drop one of them")
    if families.of(args).is_multimodal and (args.eod_mask_loss or args.reset_position_ids or args.reset_attention_mask
                                  or per_split):
        raise error("--eod-mask-loss/--reset-position-ids/--reset-attention-mask/--*-data-path apply to "
                    "token datasets, not --model llava's conversations")


def _check_validation_flags(args: argparse.Namespace, error) -> None:
    """``--full-validation`` reads whole validation sets of token datasets (training/evaluate.py);
    ``--multiple-validation-sets`` needs it (as Megatron-LM 0.16.1) and one set per --valid-data-path prefix."""
    if args.multiple_validation_sets and not args.full_validation:
        raise error("--multiple-validation-sets needs --full-validation (as in Megatron-LM 0.16.1)")
    if args.multiple_validation_sets and not args.valid_data_path:
        raise error("--multiple-validation-sets keeps one validation set per --valid-data-path prefix: give "
                    "--valid-data-path")
    if not args.full_validation:
        return
    if args.mock_data or args.sft or families.of(args).is_multimodal:
        raise error("--full-validation reads a whole validation set of --data-path/--valid-data-path token data; "
                    "mock data, SFT and --model llava have none")
    weighted = [p for p in (args.data_path, None if args.multiple_validation_sets else args.valid_data_path)
                if p and get_blend(p)[1] is not None]
    if weighted:
        raise error("--full-validation reads one epoch of the validation data, which a weighted blend does not "
                    "define: give the prefixes without weights (or --multiple-validation-sets)")
