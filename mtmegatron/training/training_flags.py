"""Megatron-LM training flags that the table registers (megatron_flags.READ_BY_CODE) and small hooks read, each
with Megatron-LM core_v0.16.1's meaning:

- ``--dataloader-type``: ``single`` (Megatron-LM's default: one pass in order, MegatronPretrainingSampler) is what
  training/data.py reads; ``cyclic`` and ``external`` are refused with the reason.
- ``--no-weight-decay-cond-type apply_wd_to_qk_layernorm``: deprecated in Megatron-LM, which turns it into
  ``--apply-wd-to-qk-layernorm`` (an OptimizerConfig field: megatron-core's ``get_standard_config_overrides``
  then keeps weight decay on the q/k layer norms).
- ``--ddp-num-buckets N``: the DDP bucket size is this rank's parameter count // N (excludes ``--ddp-bucket-size``).
- ``--use-tp-pp-dp-mapping``: megatron-core's rank order ``tp-cp-ep-pp-dp`` instead of ``tp-cp-ep-dp-pp``.
- ``--logging-level`` (else ``MEGATRON_LOGGING_LEVEL``): the root logger's level.
- ``--quick-geglu``: megatron-core's ``quick_gelu`` in a gated linear unit (not with ``--swiglu``).
- ``--dump-param-to-param-group-map PATH``: passed to megatron-core's ``get_megatron_optimizer``.
- the dataset builder's fields (``--num-dataset-builder-threads``, ``--mid-level-dataset-surplus``,
  ``--allow-ambiguous-pad-tokens``, ``--dataloader-fast-cache-load``, ``--dataloader-defer-npy-index-mmap``,
  ``--per-dataset-sequences-path``) go to megatron-core's GPTDatasetConfig as in Megatron-LM's pretrain_gpt.py.
May assume: argparse flags registered from the table with Megatron-LM's defaults; ``check`` runs inside
arguments.CHECKS (before any process group).
"""

from __future__ import annotations

import argparse
import json
import logging
import os

from mtmegatron.utils.errors import ConfigError

DATALOADER_REFUSED = {
    "cyclic": "--dataloader-type cyclic: its per-epoch shuffle is not built (mtmegatron reads one "
              "layout-independent pass in order: Megatron-LM's 'single', the default)",
    "external": "--dataloader-type external: Megatron-LM passes a user-built dataloader through; mtmegatron.pretrain "
                "builds its own (no hook for a user's dataloader)",
}

# GPTDatasetConfig field <- flag dest (Megatron-LM's pretrain_gpt.core_gpt_dataset_config_from_args)
DATASET_FIELDS = {
    "num_dataset_builder_threads": "num_dataset_builder_threads",
    "mid_level_dataset_surplus": "mid_level_dataset_surplus",
    "allow_ambiguous_pad_tokens": "allow_ambiguous_pad_tokens",
    "fast_cache_load": "dataloader_fast_cache_load",
    "defer_npy_index_mmap": "dataloader_defer_npy_index_mmap",
}


def check(args: argparse.Namespace) -> None:
    if args.dataloader_type in DATALOADER_REFUSED:
        raise ConfigError(DATALOADER_REFUSED[args.dataloader_type])
    if args.no_weight_decay_cond_type is not None:  # Megatron-LM: deprecated alias, then cleared
        args.apply_wd_to_qk_layernorm = True
        args.no_weight_decay_cond_type = None
    if args.ddp_num_buckets is not None:
        if args.ddp_bucket_size is not None:
            raise ConfigError("--ddp-num-buckets and --ddp-bucket-size exclude each other (as in Megatron-LM)")
        if args.ddp_num_buckets <= 0:
            raise ConfigError(f"--ddp-num-buckets must be positive, not {args.ddp_num_buckets}")
    if args.quick_geglu and args.swiglu:
        raise ConfigError("--quick-geglu and --swiglu exclude each other (as in Megatron-LM)")
    if (args.dataloader_fast_cache_load or args.dataloader_defer_npy_index_mmap) and not args.data_cache_path:
        raise ConfigError("--dataloader-fast-cache-load and --dataloader-defer-npy-index-mmap need the dataset caches: "
                          "give --data-cache-path (as in Megatron-LM)")


def parallel_order(args: argparse.Namespace) -> str:
    """megatron-core's rank order for initialize_model_parallel (Megatron-LM's initialize.py)."""
    return "tp-cp-ep-pp-dp" if args.use_tp_pp_dp_mapping else "tp-cp-ep-dp-pp"


def apply_logging_level(args: argparse.Namespace) -> int | None:
    """Megatron-LM's rule: ``--logging-level`` wins over ``MEGATRON_LOGGING_LEVEL``; the root logger gets it."""
    level = args.logging_level
    if level is None and os.environ.get("MEGATRON_LOGGING_LEVEL") is not None:
        level = int(os.environ["MEGATRON_LOGGING_LEVEL"])
    if level is not None:
        logging.getLogger().setLevel(level)
    return level


def ddp_bucket_size(args: argparse.Namespace, chunks) -> int:
    """``--ddp-num-buckets``: this rank's parameters (all model chunks) // N, as Megatron-LM's get_model."""
    return sum(p.nelement() for chunk in chunks for p in chunk.parameters()) // args.ddp_num_buckets


def dataset_config_fields(args: argparse.Namespace) -> dict:
    fields = {field: getattr(args, dest) for field, dest in DATASET_FIELDS.items()}
    if args.per_dataset_sequences_path is not None:
        with open(args.per_dataset_sequences_path) as f:
            fields["sequences_per_dataset"] = json.load(f)
    return fields
