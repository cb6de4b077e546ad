"""One rank's view of megatron-core's parallel state, without the world: what the planner builds a model chunk in.

megatron-core's layers ask ``parallel_state`` for their TP/PP/EP sizes and ranks (the ``_MPU_*`` overrides answer
first) and for process groups, whose ``size()``/``rank()`` they read through ``megatron.core.utils.get_pg_size`` --
which answers 1 unless ``torch.distributed`` is initialised. So ``rank_position`` starts a one-process gloo group
on an in-memory store (no port, no launcher) when none exists, and installs ``PlannedGroup`` objects (a size and a
rank, nothing else: no collective can run) in every group slot, plus the ``_MPU_*`` sizes and ranks, for one rank
position at a time; on exit every slot gets its old value back and the one-process group is destroyed. Model
construction only reads sizes and ranks; a layer that tried to communicate while being built would fail loudly on
``PlannedGroup`` (it has no collective methods), never hang.
May assume: megatron-core 0.16 (the group slot names below are its parallel_state globals); nothing else of this
process uses megatron-core's parallel state while the context is open.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys

import torch
from megatron.core import parallel_state as ps


@dataclasses.dataclass(frozen=True)
class PlannedGroup:
    """A stand-in process group: its size and this rank's place in it."""
    world: int
    me: int = 0

    def size(self) -> int:
        return self.world

    def rank(self) -> int:
        return self.me


@dataclasses.dataclass(frozen=True)
class Layout:
    """The parallel sizes of the run (as megatron-core derives them from the flags)."""
    tp: int
    pp: int
    vpp: int | None
    cp: int
    ep: int
    etp: int
    dp: int
    world: int

    @property
    def expert_dp(self) -> int:
        """megatron-core's expert data-parallel size: world / (expert-TP x EP x PP)."""
        return self.world // (self.etp * self.ep * self.pp)

    @classmethod
    def of(cls, args) -> "Layout":
        etp = args.expert_tensor_parallel_size or args.tensor_model_parallel_size
        return cls(tp=args.tensor_model_parallel_size, pp=args.pipeline_model_parallel_size,
                   vpp=args.virtual_pipeline_model_parallel_size, cp=args.context_parallel_size,
                   ep=args.expert_model_parallel_size, etp=etp, dp=args.data_parallel_size, world=args.world_size)


def _groups(layout: Layout, pp_rank: int) -> dict[str, PlannedGroup]:
    tp, pp, cp, ep, etp, dp = layout.tp, layout.pp, layout.cp, layout.ep, layout.etp, layout.dp
    g = PlannedGroup
    return {
        "_TENSOR_MODEL_PARALLEL_GROUP": g(tp), "_PIPELINE_MODEL_PARALLEL_GROUP": g(pp, pp_rank),
        "_MODEL_PARALLEL_GROUP": g(tp * pp), "_CONTEXT_PARALLEL_GROUP": g(cp),
        "_TENSOR_AND_CONTEXT_PARALLEL_GROUP": g(tp * cp), "_TENSOR_AND_DATA_PARALLEL_GROUP": g(tp * dp),
        "_TENSOR_AND_DATA_PARALLEL_GROUP_WITH_CP": g(tp * dp * cp),
        "_DATA_PARALLEL_GROUP": g(dp), "_DATA_PARALLEL_GROUP_GLOO": g(dp), "_DATA_PARALLEL_GROUP_WITH_CP": g(dp * cp),
        "_DATA_PARALLEL_GROUP_WITH_CP_GLOO": g(dp * cp), "_INTRA_PARTIAL_DATA_PARALLEL_GROUP_WITH_CP": g(dp * cp),
        # no embedding group: megatron-core then skips the all-reduce that copies a tied embedding (or MTP's) from
        # the first stage to the last at construction (language_module.py); the copy still exists and is counted
        "_EMBEDDING_GROUP": None, "_POSITION_EMBEDDING_GROUP": g(1),
        "_EXPERT_MODEL_PARALLEL_GROUP": g(ep), "_EXPERT_TENSOR_PARALLEL_GROUP": g(etp),
        "_EXPERT_TENSOR_AND_MODEL_PARALLEL_GROUP": g(etp * ep),
        "_EXPERT_TENSOR_MODEL_PIPELINE_PARALLEL_GROUP": g(etp * ep * pp),
        "_EXPERT_DATA_PARALLEL_GROUP": g(layout.expert_dp), "_INTRA_PARTIAL_EXPERT_DATA_PARALLEL_GROUP": g(layout.expert_dp),
    }


def _mpu(layout: Layout, pp_rank: int) -> dict[str, int | None]:
    return {
        "_MPU_TENSOR_MODEL_PARALLEL_WORLD_SIZE": layout.tp, "_MPU_TENSOR_MODEL_PARALLEL_RANK": 0,
        "_MPU_PIPELINE_MODEL_PARALLEL_WORLD_SIZE": layout.pp, "_MPU_PIPELINE_MODEL_PARALLEL_RANK": pp_rank,
        "_MPU_EXPERT_MODEL_PARALLEL_WORLD_SIZE": layout.ep, "_MPU_EXPERT_MODEL_PARALLEL_RANK": 0,
        "_MPU_EXPERT_TENSOR_PARALLEL_WORLD_SIZE": layout.etp, "_MPU_EXPERT_TENSOR_PARALLEL_RANK": 0,
        "_MPU_DATA_PARALLEL_WORLD_SIZE": layout.dp, "_MPU_DATA_PARALLEL_RANK": 0,
        "_VIRTUAL_PIPELINE_MODEL_PARALLEL_WORLD_SIZE": layout.vpp, "_VIRTUAL_PIPELINE_MODEL_PARALLEL_RANK": None,
    }


@contextlib.contextmanager
def rank_position(layout: Layout, pp_rank: int):
    """megatron-core's parallel state as pipeline stage ``pp_rank`` (TP, EP and DP rank 0) of ``layout`` sees it.
    All TP (and EP) ranks of a stage hold shards of one size: megatron-core divides evenly, and the flag checks
    refuse a size that does not divide."""
    values = {**_groups(layout, pp_rank), **_mpu(layout, pp_rank)}
    saved = {name: getattr(ps, name) for name in values}
    started = not torch.distributed.is_initialized()
    hook = sys.excepthook  # init_process_group wraps it in a "[rank0]: " prefixer, one more layer per call
    if started:
        torch.distributed.init_process_group("gloo", store=torch.distributed.HashStore(), rank=0, world_size=1)
    try:
        for name, value in values.items():
            setattr(ps, name, value)
        yield
    finally:
        for name, value in saved.items():
            setattr(ps, name, value)
        if started:
            torch.distributed.destroy_process_group()
            sys.excepthook = hook
