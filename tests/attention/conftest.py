"""Shared by tests/attention: a one-rank cpu setup for the in-process attention tests."""

from __future__ import annotations

import os

import pytest
import torch


@pytest.fixture(scope="module")
def single_rank():
    """cpu backend active, a 1-rank process group and megatron-core's parallel state + RNG tracker (per module)."""
    import mtmegatron
    from megatron.core import parallel_state, tensor_parallel

    from helpers.pretrain_runner import free_port

    mtmegatron.activate("cpu")
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    torch.distributed.init_process_group("gloo", rank=0, world_size=1)
    parallel_state.initialize_model_parallel()
    tensor_parallel.model_parallel_cuda_manual_seed(1234)
    yield
    parallel_state.destroy_model_parallel()
    torch.distributed.destroy_process_group()
    mtmegatron.deactivate()
