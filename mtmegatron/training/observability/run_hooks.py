"""Everyday observability of a training run, called by the loop at a few points: throughput and MFU, timers,
memory, parameter norm, world size, validation perplexity, the profiler, wandb, and manual garbage collection.

``log(row)`` completes the iteration's metrics row with what the flags ask for and hands it to metrics.jsonl /
tensorboard (utils/metrics.py, rank 0) and wandb (the last rank); row keys (metrics.jsonl and tensorboard
tags): ``loss_scale`` (from train_step, as Megatron-LM logs it: 1.0 without --fp16; not to tensorboard/wandb with
--no-log-loss-scale-to-tensorboard), ``moe_aux_loss``/``moe_z_loss``/``mtp_loss`` (models/aux_losses.py),
``throughput`` (TFLOP/s per device), ``mfu``, ``params_norm``, ``num_zeros_in_grad`` (from train_step), ``world_size``,
``val_ppl``, ``mem_*_bytes``, and with --log-timers-to-tensorboard Megatron-LM's ``<timer>-time`` tags at each log
interval.
``--manual-gc`` as Megatron-LM: automatic collection off from the first step, a full collection at the start,
every --manual-gc-interval iterations and before validation, a young-generation one after it; the automatic
collector is switched back on by ``close``.
May assume: built after the model and optimizer, on every rank; every method is called on every rank at the
same iterations (timers, parameter norm and the save timer are collectives).
"""

from __future__ import annotations

import contextlib
import gc
import math
import os

import torch

from mtmegatron.backends.device import compute_device, on_host
from mtmegatron.training.observability.params_norm import params_l2_norm
from mtmegatron.training.observability.profiler import StepProfiler
from mtmegatron.training.observability.section import Observability, Shape
from mtmegatron.training.observability.step_timers import StepTimers, timed
from mtmegatron.training.observability.throughput import num_floating_point_operations, peak_bf16_tflops, tflops_per_device
from mtmegatron.training.observability.wandb_log import WandbSink


def memory_stats(device: torch.device) -> dict:
    """Megatron-LM's four allocator statistics of the device; the process RSS on the cpu backend."""
    if on_host(device):
        import psutil

        return {"mem_rss_bytes": psutil.Process().memory_info().rss}
    module = torch.get_device_module(device.type)
    if hasattr(module, "memory_stats"):
        stats = module.memory_stats(device)
        return {"mem_reserved_bytes": stats.get("reserved_bytes.all.current", 0),
                "mem_allocated_bytes": stats.get("allocated_bytes.all.current", 0),
                "mem_max_allocated_bytes": stats.get("allocated_bytes.all.peak", 0),
                "mem_allocated_count": stats.get("allocation.all.current", 0)}
    if hasattr(module, "memory_allocated"):
        return {"mem_allocated_bytes": module.memory_allocated(device),
                "mem_max_allocated_bytes": module.max_memory_allocated(device)}
    return {}


def _device_peak(backend, device: torch.device) -> tuple[str, float | None]:
    """(device name, dense bf16 peak TFLOP/s or None); the cpu backend has none."""
    if backend.device_is_host:
        return backend.name, None
    module = backend.device_module()
    name = module.get_device_name(device) if hasattr(module, "get_device_name") else device.type
    return name, peak_bf16_tflops(name)


class ManualGC:
    """--manual-gc, --manual-gc-interval, --no-manual-gc-eval (Megatron-LM's collection points)."""

    def __init__(self, observability: Observability):
        self.on, self.interval = observability.manual_gc, observability.manual_gc_interval
        self.around_eval = observability.manual_gc_eval
        if self.on:
            gc.disable()
            gc.collect()

    def describe(self) -> str:
        points = ([f"every {self.interval} iterations"] if self.interval else []) + (
            ["before and after validation"] if self.around_eval else [])
        return "collecting " + " and ".join(points) if points else "no collection during training"

    def after_step(self, iteration: int) -> None:
        if self.on and self.interval and iteration % self.interval == 0:
            gc.collect()

    @contextlib.contextmanager
    def evaluation(self):
        if self.on and self.around_eval:
            gc.collect()
        yield
        if self.on and self.around_eval:
            gc.collect(generation=0)  # what validation left behind

    def close(self) -> None:
        if self.on:
            gc.enable()
            self.on = False


class RunHooks:
    """The loop's observability calls; ``shape`` for --log-throughput, ``run_config`` (the run's flags) for
    wandb's config."""

    def __init__(self, observability: Observability, shape: Shape, run_config: dict, backend, rank: int, model,
                 optimizer, writer, first_done: int):
        self.observability, self.rank, self.model, self.writer = observability, rank, model, writer
        if not observability.log_loss_scale_to_tensorboard:  # Megatron-LM: neither tensorboard nor wandb get it
            writer.tensorboard_skip.add("loss_scale")
        self.world_size = torch.distributed.get_world_size()
        self.device = compute_device()
        self.timers = StepTimers(observability, model, optimizer)
        self._reported_at = first_done
        self.flops = self.peak = None
        if observability.log_throughput:
            self.flops = num_floating_point_operations(shape, observability.global_batch_size)
            device_name, self.peak = _device_peak(backend, self.device)
            mfu = (f"MFU against the {device_name} dense bf16 peak of {self.peak:g} TFLOP/s" if self.peak else
                   f"no MFU on the {backend.name} backend" if backend.device_is_host else
                   f"MFU n/a: peak of {device_name} unknown (set MTMEGATRON_PEAK_BF16_TFLOPS)")
            self._print(f"mtmegatron: --log-throughput: {self.flops / 1e12:.6g} TFLOP per iteration (Megatron-LM's "
                        f"formula, global batch {observability.global_batch_size}); {mfu}")
        if observability.log_memory_to_tensorboard and backend.device_is_host:
            self._print(f"mtmegatron: --log-memory-to-tensorboard: the {backend.name} backend has no device allocator "
                        "statistics; logging this process's resident memory (mem_rss_bytes) instead")
        tensorboard_dir = observability.tensorboard_dir or os.path.join(observability.log_dir, "tensorboard")
        self.profiler = StepProfiler(observability, backend, rank, first_done, tensorboard_dir)
        self.wandb = WandbSink(observability, rank, self.world_size, run_config, skip=writer.tensorboard_skip)
        self.gc = ManualGC(observability)
        if observability.manual_gc:
            self._print(f"mtmegatron: --manual-gc: automatic garbage collection off; {self.gc.describe()}")

    def _print(self, line: str) -> None:
        if self.rank == 0:
            print(line, flush=True)

    def step_begin(self, iteration: int) -> None:
        self.profiler.step_begin(iteration)

    def log(self, row: dict) -> None:
        """Complete the row (see the module docstring) and write it; then the per-step profiler and gc work."""
        obs, iteration = self.observability, row["iteration"]
        if self.flops is not None:
            row["throughput"] = tflops_per_device(self.flops, row["step_time_ms"] / 1000.0, self.world_size)
            if self.peak:
                row["mfu"] = row["throughput"] / self.peak
        if obs.log_params_norm:
            row["params_norm"] = params_l2_norm(self.model, obs.bf16 or obs.fp16)
        if obs.log_world_size_to_tensorboard:
            row["world_size"] = self.world_size
        if obs.log_memory_to_tensorboard:
            row.update(memory_stats(self.device))
        if obs.log_validation_ppl_to_tensorboard and row.get("val_loss") is not None:
            row["val_ppl"] = math.exp(min(20.0, row["val_loss"]))
        timers_text = None
        if iteration % obs.log_interval == 0 or iteration == obs.train_iters:
            values, timers_text = self.timers.report(iteration - self._reported_at)
            row.update(values)
            self._reported_at = iteration
        self.writer.log(row)
        if timers_text:
            self._print(timers_text)
        self.wandb.log(row)
        self.profiler.step_end(iteration)
        self.gc.after_step(iteration)

    @contextlib.contextmanager
    def evaluation(self):
        """Around validation: manual gc's collections; the timers paused, as Megatron-LM's evaluate does."""
        with self.gc.evaluation(), self.timers.paused():
            yield

    @contextlib.contextmanager
    def saving(self):
        """The save-checkpoint timer (ranks synchronised before and after), printed after the save."""
        with timed(self.model[0], "save-checkpoint", log_level=0, barrier=True, stop_barrier=True):
            yield
        self.timers.print_now("save-checkpoint", self.rank)

    def close(self) -> None:
        self.timers.close()
        self.profiler.close()
        self.wandb.close()
        self.gc.close()
