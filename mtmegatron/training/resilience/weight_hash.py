"""``--check-weight-hash-across-dp-replicas-interval N``: megatron-core's ``check_param_hashes_across_dp_replicas``
(SHA-1 of every parameter, all-gathered over the data-parallel and expert-data-parallel groups, cross-checked)
before the first iteration and every N iterations, as Megatron-LM 0.16.1's training loop does; a mismatch stops
the run naming it, a match prints Megatron-LM's line ``>>> Weight hashes match after I iterations...``.
With ``--overlap-param-gather`` the parameters are gathered first (training/overlap.ParamGather).
Takes the run's ``Resilience`` section (training/resilience/section.py).
May assume: process groups are up; the model chunks are megatron-core DDP modules.
"""

from __future__ import annotations

import torch
from megatron.core.utils import check_param_hashes_across_dp_replicas

from mtmegatron.training.resilience.section import Resilience
from mtmegatron.utils.metrics import print_rank0


def due(resilience: Resilience, iteration: int, first: bool) -> bool:
    interval = resilience.check_weight_hash_across_dp_replicas_interval
    return interval is not None and (first or iteration % interval == 0)


def check(model, iteration: int) -> None:
    if not check_param_hashes_across_dp_replicas(model, cross_check=True):
        raise RuntimeError(f"parameter hashes differ across data-parallel replicas after {iteration} iterations "
                           "(--check-weight-hash-across-dp-replicas-interval)")
    torch.distributed.barrier()
    print_rank0(torch.distributed.get_rank(), f">>> Weight hashes match after {iteration} iterations...")
