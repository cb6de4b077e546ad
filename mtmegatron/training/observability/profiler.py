"""``--profile``, ``--profile-step-start``, ``--profile-step-end``, ``--profile-ranks``, ``--use-pytorch-profiler``.

Iterations are numbered as in the log (the first step of a fresh run is iteration 1).
- torch profiler (``--use-pytorch-profiler``; and ``--profile`` alone on a backend without an nsys range, said
  once at start-up): Megatron-LM's schedule (one warm-up step, then iterations start .. end-1 recorded; record_shapes and
  with_stack on), activities CPU plus the backend's ``profiler_activity`` (CUDA; PrivateUse1 for MUSA, where
  torch_musa registers its device activity), one chrome trace ``rank<R>.<time>.pt.trace.json`` per profiled rank in the
  tensorboard directory. The window is in absolute iterations, so a resumed run profiles the same steps.
- nsys range (``--profile`` alone where the backend has ``nsys_range``: CUDA, as Megatron-LM): the device profiler API is started before iteration
  start+1 and stopped after iteration end, with NVTX ranges per op (``torch.autograd.profiler.emit_nvtx``), for
  ``nsys profile --capture-range=cudaProfilerApi``.
May assume: called on every rank; ``step_begin``/``step_end`` around every training step, ``close`` at the end.
"""

from __future__ import annotations

import os

import torch

from mtmegatron.training.observability.section import Observability

def profiler_activities(backend) -> list:
    """CPU plus the device's activity where this torch has it (never fails on a CPU-only build)."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    name = backend.profiler_activity
    if name and hasattr(torch.profiler.ProfilerActivity, name):
        activities.append(getattr(torch.profiler.ProfilerActivity, name))
    return activities


def profiler_kind(observability: Observability, backend) -> str:
    """'torch' or 'nsys' (Megatron-LM's --profile without --use-pytorch-profiler, where the backend has it)."""
    return "nsys" if not observability.use_pytorch_profiler and backend.nsys_range else "torch"


class StepProfiler:
    def __init__(self, observability: Observability, backend, rank: int, first_done: int, trace_dir: str):
        """``first_done``: the iteration the run starts after (0, or a loaded checkpoint's)."""
        self.end = observability.profile_step_end
        self._prof = None
        self._nvtx = None
        self._device = None
        self.kind = profiler_kind(observability, backend) if observability.profile else None
        if observability.profile and rank == min(observability.profile_ranks, default=-1) and self.kind == "torch" \
                and not observability.use_pytorch_profiler:
            print(f"mtmegatron: --profile without --use-pytorch-profiler: the {backend.name} backend has no nsys "
                  "range (Megatron-LM's cudaProfilerStart); writing a torch profiler trace instead", flush=True)
        if not observability.profile or rank not in observability.profile_ranks:
            self.kind = None
            return
        self.start = observability.profile_step_start
        if self.kind == "nsys":
            self._device = backend.device_module()
            return
        first = max(self.start, first_done + 1)  # the first recorded iteration
        active = self.end - first
        if active <= 0:
            print(f"mtmegatron: rank {rank}: --profile: iterations {self.start}..{self.end - 1} were done before "
                  f"this run (it starts after iteration {first_done}); nothing profiled", flush=True)
            self.kind = None
            return
        os.makedirs(trace_dir, exist_ok=True)
        # profiler step k is iteration first_done + k (step() is called before each iteration; step 0 is idle)
        self._prof = torch.profiler.profile(
            activities=profiler_activities(backend),
            schedule=torch.profiler.schedule(wait=first - first_done - 1, warmup=1, active=active, repeat=1),
            on_trace_ready=torch.profiler.tensorboard_trace_handler(trace_dir, worker_name=f"rank{rank}"),
            record_shapes=True,
            with_stack=True,
        )
        self._prof.start()
        print(f"mtmegatron: rank {rank}: torch profiler will record iterations {first}..{self.end - 1} into "
              f"{trace_dir}", flush=True)

    def step_begin(self, iteration: int) -> None:
        if self._prof is not None:
            self._prof.step()
        elif self.kind == "nsys" and iteration == self.start + 1:
            self._device.profiler.start()
            self._nvtx = torch.autograd.profiler.emit_nvtx(record_shapes=True)
            self._nvtx.__enter__()

    def step_end(self, iteration: int) -> None:
        if iteration == self.end:
            self.close()

    def close(self) -> None:
        if self._prof is not None:
            self._prof.stop()  # writes the trace if the run ended inside the window
            self._prof = None
        if self._nvtx is not None:
            self._device.profiler.stop()
            self._nvtx.__exit__(None, None, None)
            self._nvtx = None
        self.kind = None
