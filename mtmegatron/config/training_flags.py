"""Megatron-LM training flags that the table registers (megatron_flags.READ_BY_CODE) and small hooks read, each
with Megatron-LM core_v0.16.1's meaning:

- ``--dataloader-type``: ``single`` (Megatron-LM's default: one pass in order, MegatronPretrainingSampler) is what
  training/data.py reads; ``cyclic`` and ``external`` are refused with the reason.
- ``--no-weight-decay-cond-type apply_wd_to_qk_layernorm``: deprecated in Megatron-LM, which turns it into
  ``--apply-wd-to-qk-layernorm`` (an OptimizerConfig field: megatron-core's ``get_standard_config_overrides``
  then keeps weight decay on the q/k layer norms).
- ``--ddp-num-buckets N``: the DDP bucket size is this rank's parameter count // N (excludes ``--ddp-bucket-size``).
- ``--use-tp-pp-dp-mapping``: megatron-core's rank order ``tp-cp-ep-pp-dp`` instead of ``tp-cp-ep-dp-pp``.
- ``--logging-level`` (else ``MEGATRON_LOGGING_LEVEL``): the root logger's level (these three: training/setup.py).
- ``--quick-geglu``: megatron-core's ``quick_gelu`` in a gated linear unit (not with ``--swiglu``).
- ``--dump-param-to-param-group-map PATH``: passed to megatron-core's ``get_megatron_optimizer``.
- ``--optimizer muon|dist_muon``: megatron-core's ``get_megatron_muon_optimizer`` (Muon on 2-D non-embedding weights,
  Adam on the rest; ``dist_muon`` shards it with megatron-core's LayerWiseDistributedOptimizer), as Megatron-LM's
  ``setup_model_and_optimizer``; the ``--muon-*`` flags are OptimizerConfig fields. It needs the
  ``emerging-optimizers`` package (extra ``muon``): without it, one line at parse time. Megatron-LM's
  ``validate_args`` refusals for Muon (overlap, distributed optimizer, FSDP) and megatron-core's (fp16) are one line.
- the dataset builder's fields (``--num-dataset-builder-threads``, ``--mid-level-dataset-surplus``,
  ``--allow-ambiguous-pad-tokens``, ``--dataloader-fast-cache-load``, ``--dataloader-defer-npy-index-mmap``,
  ``--per-dataset-sequences-path``) go to megatron-core's GPTDatasetConfig as in Megatron-LM's pretrain_gpt.py
  (data/dataset_fields.py).
May assume: argparse flags registered from the table with Megatron-LM's defaults; ``check_training_args`` runs inside
arguments.CHECKS (before any process group).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import inspect

from mtmegatron.utils.errors import ConfigError

DATALOADER_REFUSED = {
    "cyclic": "--dataloader-type cyclic: its per-epoch shuffle is not built (mtmegatron reads one "
              "layout-independent pass in order: Megatron-LM's 'single', the default)",
    "external": "--dataloader-type external: Megatron-LM passes a user-built dataloader through; mtmegatron.pretrain "
                "builds its own (no hook for a user's dataloader)",
}

# what megatron-core's optimizer/muon.py imports from the emerging-optimizers package. megatron-core 0.16.1 calls
# the v0.1.0 API (Megatron-LM 0.16.1 pins v0.1.0 from git; it has no wheel on PyPI): 0.2+ renamed use_nesterov to
# nesterov (and newton_schulz_tp's mode to tp_mode) and needs Python >= 3.12. Every version imports triton.
MUON_MODULE = "emerging_optimizers.orthogonalized_optimizers"
MUON_INSTALL = ("pip install 'mtmegatron[muon]' (emerging-optimizers v0.1.0 from its git tag, as Megatron-LM "
                "0.16.1 pins it; it imports triton, which CUDA builds of torch bring)")
# Megatron-LM core_v0.16.1 validate_args (asserts) and megatron-core's get_megatron_muon_optimizer (raises)
MUON_REFUSED = (
    ("overlap_grad_reduce", "--overlap-grad-reduce"), ("overlap_param_gather", "--overlap-param-gather"),
    ("use_distributed_optimizer", "--use-distributed-optimizer"), ("use_torch_fsdp2", "--use-torch-fsdp2"),
    ("use_megatron_fsdp", "--use-megatron-fsdp"), ("fp16", "--fp16"),
)


def check_muon(args: argparse.Namespace) -> None:
    if "muon" not in args.optimizer:
        return
    for dest, flag in MUON_REFUSED:
        if getattr(args, dest):
            raise ConfigError(f"--optimizer {args.optimizer} does not support {flag} (as in Megatron-LM 0.16.1)")
    try:
        module = importlib.import_module(MUON_MODULE)
    except ImportError as e:
        raise ConfigError(f"--optimizer {args.optimizer} needs the emerging-optimizers package, which megatron-core's "
                          f"Muon imports ({e}): {MUON_INSTALL}") from None
    if "use_nesterov" not in inspect.signature(module.OrthogonalizedOptimizer.__init__).parameters:
        raise ConfigError(f"--optimizer {args.optimizer}: megatron-core 0.16's Muon calls the emerging-optimizers 0.1 "
                          f"API; the installed emerging-optimizers{_version('emerging-optimizers')} renamed it "
                          f"(use_nesterov -> nesterov): {MUON_INSTALL}")


def _version(distribution: str) -> str:
    try:
        return " " + importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return ""


def check_training_args(args: argparse.Namespace) -> None:
    check_muon(args)
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
