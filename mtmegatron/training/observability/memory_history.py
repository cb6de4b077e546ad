"""``--record-memory-history`` / ``--memory-snapshot-path``: Megatron-LM's allocator history on the device.

As Megatron-LM (model_provider.py, training.py): the caching allocator of the backend's device module records
every allocation and free with its stack (``memory._record_memory_history``, 100,000 entries); the last rank
pickles ``memory._snapshot()`` to ``--memory-snapshot-path`` after the first step and every ``--log-interval``
steps (open it at https://pytorch.org/memory_viz), and to ``oom_rank-<rank>_<path>`` when the device runs out of
memory (where the backend's torch has the out-of-memory observer). Recording starts here before the first step
(Megatron-LM starts it before the model is built, so its snapshot also lists the model's allocations).
The host has no caching allocator to record: on the cpu backend (and on a device module without the recorder)
one start-up line says that nothing is recorded.
May assume: the device of this rank is set; called on every rank.
"""

from __future__ import annotations

import pickle

import torch

from mtmegatron.training.observability.section import Observability
from mtmegatron.utils.metrics import print_rank0


class MemoryHistory:
    def __init__(self, observability: Observability, backend, rank: int):
        self._memory = None
        self._path = observability.memory_snapshot_path
        self._interval = observability.log_interval
        world_size = torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1
        self._last_rank = rank == world_size - 1
        if not observability.record_memory_history:
            return
        if backend.device_is_host:
            print_rank0(rank, f"mtmegatron: --record-memory-history: records nothing on the {backend.name} backend (the "
                              f"host has no caching allocator to record); {self._path} is not written")
            return
        memory = getattr(backend.device_module(), "memory", None)
        if not hasattr(memory, "_record_memory_history"):
            print_rank0(rank, f"mtmegatron: --record-memory-history: records nothing: torch.{backend.device_type}"
                              f".memory has no _record_memory_history here; {self._path} is not written")
            return
        memory._record_memory_history(True, trace_alloc_max_entries=100000, trace_alloc_record_context=True)
        self._memory = memory
        observer = getattr(torch._C, f"_{backend.device_type}_attach_out_of_memory_observer", None)
        if observer is not None:
            observer(self._on_oom)
        print_rank0(rank, f"mtmegatron: --record-memory-history: the last rank writes {self._path} after the first "
                          f"step and every {self._interval} steps")

    def _on_oom(self, device, alloc, device_alloc, device_free):
        self._write(f"oom_rank-{torch.distributed.get_rank()}_{self._path}")

    def _write(self, path: str) -> None:
        with open(path, "wb") as f:
            pickle.dump(self._memory._snapshot(), f)

    def after_step(self, iteration: int, first: bool) -> None:
        if self._memory is not None and self._last_rank and (first or iteration % self._interval == 0):
            self._write(self._path)
