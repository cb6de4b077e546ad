"""``--distributed-timeout-seconds-after-init S``: after the first trained iteration (usually the slowest one) every
megatron-core process group gets the timeout S, by megatron-core's ``update_pg_timeout``, as Megatron-LM 0.16.1's
training loop does. Rank 0 prints the data-parallel group's timeout read back from its backend.
Takes the run's ``Resilience`` section (training/resilience/section.py).
May assume: process groups are up (megatron-core's parallel state initialised).
"""

from __future__ import annotations

from datetime import timedelta

import torch
from megatron.core import parallel_state

from mtmegatron.backends.device import compute_device
from mtmegatron.training.resilience.section import Resilience
from mtmegatron.utils.metrics import print_rank0


def _timeout_of(group) -> str:
    try:
        return str(group._get_backend(compute_device()).options._timeout)
    except (AttributeError, RuntimeError):  # a backend that does not expose its options
        return "set"


def after_first_iteration(resilience: Resilience) -> None:
    seconds = resilience.distributed_timeout_seconds_after_init
    if seconds is None:
        return
    parallel_state.update_pg_timeout(timedelta(seconds=seconds))
    print_rank0(torch.distributed.get_rank(), "mtmegatron: --distributed-timeout-seconds-after-init: process-group "
                f"timeout now {_timeout_of(parallel_state.get_data_parallel_group())}")
