"""Conformance: megatron-core's tensor-parallel RNG and 1-D split/gather utilities behave as on CUDA.

- ``convert_cuda_rng_state``: a device-generator state tensor becomes a cloned generator (the graph-safe form) that
  continues the same stream, and converts back to the same tensor; converting leaves the device generator alone.
- The CUDA-graph-safe tracker (``initialize_rng_tracker(use_cudagraphable_rng=True)``): where the device generator
  has graph-safe state its forks continue their own stream and leave the default stream where it was; where it has
  none (the cpu backend: torch's CPU generator; the simulated MUSA device too) one RuntimeError says so
  (patches/graph_safe_rng_tracker_refusal.py).
- ``split_tensor_into_1d_equal_chunks`` / ``gather_split_1d_tensor`` over a TP2 group (the device remap places the
  buffers, the active backend's collectives gather): each rank holds its slice, and gathering gives the whole.
"""

from __future__ import annotations

import pytest
import torch


def test_rng_state_conversion_round_trips(activated):
    from megatron.core.tensor_parallel import convert_cuda_rng_state

    device = activated.device(0)
    module = torch.cuda  # what megatron-core calls: the bridge's on cpu, torchada's on musa
    module.manual_seed(11)
    state = module.get_rng_state()
    graphable = convert_cuda_rng_state(state, to_graphable=True)
    assert isinstance(graphable, torch.Generator)
    assert torch.equal(module.get_rng_state(), state), "converting moved the device generator"
    assert convert_cuda_rng_state(graphable, to_graphable=True) is graphable
    assert torch.equal(convert_cuda_rng_state(graphable, to_graphable=False), state)
    assert convert_cuda_rng_state(state, to_graphable=False) is state
    expected = torch.rand(16, device=device)  # the device generator's next numbers from ``state``
    assert torch.equal(torch.rand(16, device=device, generator=graphable), expected)
    with pytest.raises(ValueError):
        convert_cuda_rng_state([1, 2], to_graphable=True)


def test_graph_safe_tracker_works_or_is_refused(activated):
    from megatron.core.tensor_parallel import random as tp_random

    from mtmegatron.patches.graph_safe_rng_tracker_refusal import device_generator_is_graph_safe

    device = activated.device(0)
    try:
        if not device_generator_is_graph_safe():
            assert activated.name != "cuda"  # CUDA generators have graph-safe state (torch >= 2.5)
            with pytest.raises(RuntimeError, match=f"graph-safe state .*; the {activated.name} backend's has none"):
                tp_random.initialize_rng_tracker(use_cudagraphable_rng=True, force_reset=True)
            return
        tp_random.initialize_rng_tracker(use_cudagraphable_rng=True, force_reset=True)
        tracker = tp_random.get_cuda_rng_tracker()
        tracker.add("model-parallel-rng", 123)
        torch.cuda.manual_seed(5)
        default_first = torch.rand(8, device=device)
        with tracker.fork():
            forked_first = torch.rand(8, device=device)
        with tracker.fork():
            forked_second = torch.rand(8, device=device)
        default_second = torch.rand(8, device=device)
        torch.cuda.manual_seed(5)
        assert torch.equal(torch.rand(8, device=device), default_first)
        assert torch.equal(torch.rand(8, device=device), default_second), "a fork moved the default stream"
        torch.cuda.manual_seed(123)
        assert torch.equal(torch.rand(16, device=device), torch.cat([forked_first, forked_second]))
    finally:
        tp_random.initialize_rng_tracker(force_reset=True)


def _split_gather_worker(rank, world_size, backend_name):
    import torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.utils import gather_split_1d_tensor, split_tensor_into_1d_equal_chunks

    import mtmegatron

    backend = mtmegatron.activate(backend_name)
    backend.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world_size)
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=2)
    try:
        whole = torch.arange(24, dtype=torch.float32, device=backend.device(rank)).view(4, 6)
        view = split_tensor_into_1d_equal_chunks(whole)
        copy = split_tensor_into_1d_equal_chunks(whole, new_buffer=True)
        gathered = gather_split_1d_tensor(copy)
        return dict(view=view.cpu(), copy=copy.cpu(), shares=view.data_ptr() == whole.data_ptr() + 48 * rank,
                    separate=copy.data_ptr() != view.data_ptr(), gathered=gathered.cpu(),
                    device=str(gathered.device), expected_device=str(whole.device))
    finally:
        parallel_state.destroy_model_parallel()


def test_split_and_gather_1d_round_trip(backend, run_ranks):
    results = run_ranks(_split_gather_worker, 2, backend.name)
    whole = torch.arange(24, dtype=torch.float32).numpy()
    for rank, r in enumerate(results):
        assert (r["view"] == whole[12 * rank:12 * (rank + 1)]).all() and (r["copy"] == r["view"]).all()
        assert r["shares"] and r["separate"], "the view is not a view, or the new buffer is not new"
        assert (r["gathered"] == whole).all()
        assert r["device"] == r["expected_device"]
