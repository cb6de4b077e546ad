"""Overlapped gradient reduce and parameter gather, wired into megatron-core the way Megatron-LM's training loop
does it.

``ddp_config`` builds megatron-core's ``DistributedDataParallelConfig`` from the flags (``overlap_grad_reduce``,
``overlap_param_gather``, ``align_param_gather`` with the interleaved schedule, bucket size);
``install_sync_funcs`` puts DDP's ``no_sync`` / ``start_grad_sync`` / ``start_param_sync`` on the transformer
config, where megatron-core's pipeline schedules call them per model chunk.

With ``--overlap-param-gather`` the distributed optimizer's step updates only this rank's shard of each
parameter; the other shards are all-gathered lazily by DDP's forward pre-hooks at the next forward. Anything that
reads the parameters outside a training forward would see stale shards. ``ParamGather`` follows Megatron-LM:
hooks off (without a gather) for the first iteration, on after the first successful step, off with a
synchronous gather around evaluation, a forced gather before every checkpoint save, and off with a final gather
when training ends (the model is then plain for sampling and export).
May assume: model chunks are megatron-core DDP wrappers; called on every rank.
"""

from __future__ import annotations

from contextlib import contextmanager

from megatron.core.distributed import DistributedDataParallelConfig
from megatron.core.distributed.torch_fully_sharded_data_parallel_config import TorchFullyShardedDataParallelConfig

from mtmegatron.models.config_from_flags import ddp_config_kwargs
from mtmegatron.training.section import Parallel


def ddp_config(args) -> DistributedDataParallelConfig:
    """Flags by field name (models/config_from_flags.py), with Megatron-LM's alignment rule and this loop's own
    inf/nan handling (training/resilience/robustness.py skips and counts such steps instead of megatron's in-DDP check);
    with --use-torch-fsdp2 the FSDP2 wrapper's config (a DistributedDataParallelConfig) with its resharding."""
    ours = dict(
        # Megatron-LM aligns the parameter all-gathers of all pipeline stages only with the interleaved schedule
        # (the schedule then dispatches them through config.param_sync_func)
        align_param_gather=(args.overlap_param_gather and bool(args.virtual_pipeline_model_parallel_size)
                            and args.align_param_gather),  # --no-align-param-gather: each chunk gathers itself
        bucket_size=args.ddp_bucket_size,  # None: megatron-core's default (>= 40M elements)
        check_for_nan_in_grad=False,
        check_for_large_grads=False,
    )
    config_class = DistributedDataParallelConfig
    if args.use_torch_fsdp2:
        config_class = TorchFullyShardedDataParallelConfig
        ours["reshard_after_forward"] = args.torch_fsdp2_reshard_after_forward
    return config_class(**ddp_config_kwargs(args, config_class, ours))


def _per_chunk(funcs: list):
    return funcs[0] if len(funcs) == 1 else funcs


def install_sync_funcs(config, model, parallel: Parallel) -> None:
    """Megatron-LM's training.setup: gradient accumulation without reduction until the last micro-batch
    (``no_sync``), grad reduce launched per chunk by the schedule (``align_grad_reduce``), and with the interleaved
    schedule the parameter all-gather launched per chunk by the schedule (``align_param_gather``). The flags come
    from the run's ``Parallel`` section: Megatron-FSDP turns its own config's ``overlap_grad_reduce`` on."""
    config.no_sync_func = config.grad_sync_func = config.param_sync_func = None
    if parallel.overlap_grad_reduce:
        config.no_sync_func = _per_chunk([chunk.no_sync for chunk in model])
        if parallel.align_grad_reduce:  # --no-align-grad-reduce: each stage reduces when its backward ends
            config.grad_sync_func = _per_chunk([chunk.start_grad_sync for chunk in model])
    if model[0].ddp_config.overlap_param_gather and model[0].ddp_config.align_param_gather:
        config.param_sync_func = _per_chunk([chunk.start_param_sync for chunk in model])


class ParamGather:
    """Keeps DDP's forward pre-hooks (the lazy parameter all-gather of --overlap-param-gather) in the states
    Megatron-LM keeps them; every method is a no-op without --overlap-param-gather."""

    def __init__(self, model, parallel: Parallel):
        self.model, self.config = model, model[0].config  # the config the schedules read
        # Megatron-FSDP gathers its parameters itself (Megatron-LM toggles no hooks for it either)
        self.active = bool(parallel.use_distributed_optimizer and parallel.overlap_param_gather
                           and not parallel.use_megatron_fsdp)
        self.hooks_on = self.active  # DDP registers the hooks when it is built
        self.stale = False  # an optimizer step updated only this rank's shards since the last full gather
        self._param_sync_func = None

    def start(self) -> None:
        """Before the first iteration: hooks off without a gather (the parameters are already equal on every
        rank after init / load, and a load error must not be spread by the first gather), and the schedule's
        ``param_sync_func`` parked so its calls are no-ops."""
        if self.hooks_on:
            for chunk in self.model:
                chunk.disable_forward_pre_hook(param_sync=False)
            self._param_sync_func, self.config.param_sync_func = self.config.param_sync_func, None
            self.hooks_on = False

    def after_step(self, update_successful: bool) -> None:
        """Hooks back on after the first successful optimizer step (its update is what they gather)."""
        if self.active and update_successful:
            self.stale = True
            if not self.hooks_on:
                self._enable()

    def _enable(self) -> None:
        for chunk in self.model:
            chunk.enable_forward_pre_hook()
        if self._param_sync_func is not None:
            self.config.param_sync_func, self._param_sync_func = self._param_sync_func, None
        self.hooks_on = True

    def sync(self) -> None:
        """Synchronous all-gather of every parameter (waits for one in flight); before a checkpoint save."""
        if self.active and self.stale:
            for chunk in self.model:
                chunk.start_param_sync(force_sync=True)
            self.stale = False

    @contextmanager
    def gathered(self):
        """Hooks off with a synchronous gather for the block (evaluation), then back as they were."""
        was_on = self.hooks_on
        self.finish()
        self.sync()  # when the hooks were already off
        try:
            yield
        finally:
            if was_on:
                self._enable()

    def finish(self) -> None:
        """Hooks off with a final synchronous gather: the model is plain afterwards."""
        if self.hooks_on:
            for chunk in self.model:
                chunk.disable_forward_pre_hook(param_sync=True)
            self.hooks_on, self.stale = False, False
