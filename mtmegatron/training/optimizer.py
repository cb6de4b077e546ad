"""The optimizer of a pretrain run: megatron-core's ``get_megatron_optimizer`` with this run's flags.

Adam's update is mtmegatron's FusedAdam (``mtmegatron::adam_step``; patches/optimizer_fused_adam.py) unless
TransformerEngine/apex provide theirs. ``--optimizer-cpu-offload`` builds megatron-core's HybridDeviceOptimizer,
made backend-neutral by patches/hybrid_optimizer_backend.py. ``--optimizer muon|dist_muon`` builds megatron-core's
``get_megatron_muon_optimizer`` (layer-wise distributed for ``dist_muon``), as Megatron-LM 0.16.1 does. Pinned host buffers are asked for only where the
backend has pinned memory (not on the cpu backend, where host memory is the device memory); rank 0 prints one
line saying what was offloaded. Test hook: ``MTMEGATRON_OPTIMIZER_STATS=DIR`` makes every rank write
``DIR/rank<R>.json`` (offload_stats after each optimizer step); with ``MTMEGATRON_TEST_DROP_GRAD=STEP`` as well,
the offloaded optimizer's STEP-th step sees no gradient for its first host-updated and first device-updated
parameter (as for an unused expert) and ``DIR/drop_grad_rank<R>.pt`` holds their values and states before and
after that step.
May assume: flags validated (arguments.py, memory_flags.py), process groups and DDP-wrapped model chunks built.
"""

from __future__ import annotations

import json
import os

import torch
from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

from mtmegatron.models.config_from_flags import optimizer_config_kwargs
from mtmegatron.optim import FusedAdam
from mtmegatron.backends.device import compute_device, on_host
from mtmegatron.training.observability.offload_stats import inner_optimizers, offload_stats

STATS_ENV = "MTMEGATRON_OPTIMIZER_STATS"
DROP_GRAD_ENV = "MTMEGATRON_TEST_DROP_GRAD"


def optimizer_config(args, params_dtype: torch.dtype) -> OptimizerConfig:
    """Flags by field name (models/config_from_flags.py); pinned host buffers only where the backend has pinned
    memory (not on the cpu backend, where host memory is the device memory)."""
    pinned = not on_host(compute_device())
    ours = dict(
        optimizer_offload_fraction=args.optimizer_offload_fraction if args.optimizer_cpu_offload else 0.0,
        pin_cpu_grads=args.pin_cpu_grads and pinned,
        pin_cpu_params=args.pin_cpu_params and pinned,
    )
    config = OptimizerConfig(**optimizer_config_kwargs(args, OptimizerConfig, ours))
    config.params_dtype = params_dtype
    return config


def build_optimizer(args, model, params_dtype: torch.dtype):
    # the offloaded optimizer's param groups name its sub-optimizer classes; they are saved in the checkpoint's
    # common state, which megatron reads with torch.load(weights_only=True)
    torch.serialization.add_safe_globals([FusedAdam, torch.optim.AdamW])
    config = optimizer_config(args, params_dtype)
    if "muon" in args.optimizer:  # emerging-optimizers checked at parse time (training_flags.check_muon)
        from megatron.core.optimizer.muon import get_megatron_muon_optimizer

        optimizer = get_megatron_muon_optimizer(config, model,
                                                layer_wise_distributed_optimizer=args.optimizer == "dist_muon")
    else:
        optimizer = get_megatron_optimizer(config, model,
                                           dump_param_to_param_group_map=args.dump_param_to_param_group_map)
    rank = torch.distributed.get_rank()
    if rank == 0:
        print(f"mtmegatron: {describe(optimizer, config)}", flush=True)
    if os.environ.get(STATS_ENV):
        _write_stats_after_each_step(optimizer, os.environ[STATS_ENV], rank)
        if os.environ.get(DROP_GRAD_ENV):
            _drop_grad_at(optimizer, int(os.environ[DROP_GRAD_ENV]), os.environ[STATS_ENV], rank)
    return optimizer


def _fmt(n: float, unit: str = "") -> str:
    for scale, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if n >= scale:
            return f"{n / scale:.1f}{suffix}{unit}"
    return f"{n:.0f}{unit and ' ' + unit}"


def describe(optimizer, config: OptimizerConfig) -> str:
    """One line: which Adam runs the update, and (with offload) what this rank offloaded (``config``: the
    OptimizerConfig it was built with)."""
    inners = inner_optimizers(optimizer)
    names = sorted({type(sub).__module__.split(".")[0] + "." + type(sub).__name__
                    for inner in inners for sub in getattr(inner, "sub_optimizers", [inner])})
    line = f"optimizer: {', '.join(names) or 'none on this rank'}"
    if not config.optimizer_cpu_offload:
        return line
    stats = offload_stats(optimizer)
    if not stats["offload"]:
        raise RuntimeError("--optimizer-cpu-offload was given but megatron-core built no HybridDeviceOptimizer")
    # states the Adam will create: fp32 master, exp_avg, exp_avg_sq (fp32) per element; the device part of
    # fp32 parameters keeps no separate master copy
    master = 4 if (config.bf16 or config.fp16) else 0
    host = stats["offloaded_params"] * (4 + 4 + 4)
    device = (stats["total_params"] - stats["offloaded_params"]) * (master + 4 + 4)
    share = stats["offloaded_params"] / max(stats["total_params"], 1)
    return (f"{line}; optimizer offload: {100 * share:.1f}% of {_fmt(stats['total_params'])} params on rank 0 "
            f"(fraction {config.optimizer_offload_fraction}), states host {_fmt(host, 'B')} / device "
            f"{_fmt(device, 'B')}; copies on {stats['streams']}")


def _write_stats_after_each_step(optimizer, directory: str, rank: int) -> None:
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"rank{rank}.json")

    def write(*_):
        with open(path, "w") as f:
            json.dump(offload_stats(optimizer), f)

    for inner in inner_optimizers(optimizer):
        inner.register_step_post_hook(write)


def _drop_grad_at(optimizer, step: int, directory: str, rank: int) -> None:
    def snapshot(hdo, orig):
        state = hdo.state.get(orig, {})
        return {"param": orig.detach().clone(),
                **{k: v.detach().clone() for k, v in state.items() if torch.is_tensor(v)}}

    for inner in inner_optimizers(optimizer):
        if not hasattr(inner, "gpu_params_map_cpu_copy"):
            continue
        calls, chosen, record = [0], {}, {}

        def pre(hdo, args, kwargs):
            calls[0] += 1
            if calls[0] != step:
                return
            params = [p for group in hdo.param_groups for p in group["params"]]
            host = [p for p in params if p in hdo.gpu_params_map_cpu_copy]
            device = [p for p in params if p not in hdo.gpu_params_map_cpu_copy]
            chosen.update({role: ps[0] for role, ps in (("host", host), ("device", device)) if ps})
            for role, p in chosen.items():
                record[role] = {"before": snapshot(hdo, p)}
                p.decoupled_grad = None
                p.grad = None

        def post(hdo, args, kwargs):
            if calls[0] != step:
                return
            for role, p in chosen.items():
                record[role]["after"] = snapshot(hdo, p)
            torch.save(record, os.path.join(directory, f"drop_grad_rank{rank}.pt"))

        inner.register_step_pre_hook(pre)
        inner.register_step_post_hook(post)
