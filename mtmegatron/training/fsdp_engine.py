"""Which engine wraps a run's model chunks: megatron-core's Megatron-FSDP, torch FSDP2, or DistributedDataParallel.

``engine(parallel)`` answers it from ``--use-megatron-fsdp`` / ``--use-torch-fsdp2`` (the run's ``Parallel``
section, training/section.py; config/fsdp_flags.py asks it of the parsed values, which carry the same names while it
checks the combinations each engine refuses); training/setup.py wraps with it.
May assume: the FSDP flags checked.
"""

from __future__ import annotations

from mtmegatron.training.section import Parallel


def engine(parallel: Parallel) -> str:
    """'megatron_fsdp', 'torch_fsdp2' or 'ddp': what wraps the model chunks (training/setup.py)."""
    return "megatron_fsdp" if parallel.use_megatron_fsdp else "torch_fsdp2" if parallel.use_torch_fsdp2 else "ddp"
