"""Which engine wraps a run's model chunks: megatron-core's Megatron-FSDP, torch FSDP2, or DistributedDataParallel.

``engine(args)`` answers it from ``--use-megatron-fsdp`` / ``--use-torch-fsdp2``; training/setup.py wraps with it,
config/fsdp_flags.py checks the combinations each engine refuses.
May assume: argparse namespaces from mtmegatron.config.arguments (the FSDP flags checked).
"""

from __future__ import annotations

import argparse


def engine(args: argparse.Namespace) -> str:
    """'megatron_fsdp', 'torch_fsdp2' or 'ddp': what wraps the model chunks (training/setup.py)."""
    return "megatron_fsdp" if args.use_megatron_fsdp else "torch_fsdp2" if args.use_torch_fsdp2 else "ddp"
