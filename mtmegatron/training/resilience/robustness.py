"""Steps that must not reach the weights, and runs that must stop cleanly.

``nonfinite_step``: after forward/backward, every rank checks its LM losses and its gradient buffers for
inf/nan and all ranks agree (one all-reduce); such a step is skipped: no optimizer step, no LR-schedule step,
weights and optimizer state untouched. megatron-core's optimizer does this itself only under fp16 loss
scaling (where it must also lower the scale), so fp16 is left to it. ``TerminationRequest``: with
``--exit-signal-handler`` the signal (``--exit-signal``, default SIGTERM) sets a flag, and
``--exit-duration-in-mins`` sets a time limit; all ranks agree on both after each iteration, so the loop saves a
checkpoint and exits cleanly even when only one rank was signalled or over time. ``data_worker_init``: with
``--exit-signal-handler`` the DataLoader's worker processes outlive the exit signal when it comes from anyone but
their rank (torchrun forwards it to each rank's whole process group, a scheduler signals every process of the
job), so the rank finishes its iteration and saves; the rank still ends them as usual.
Test hooks: ``MTMEGATRON_TEST_INJECT_NAN=ITER[,ITER...][:RANK]`` fills that rank's (default 0) gradients with
nan at those iterations; ``MTMEGATRON_TEST_STARTED_MINUTES_AGO=M[:RANK]`` moves that rank's program start M
minutes back (for ``--exit-duration-in-mins``).
The flags' values come as the run's ``Resilience`` section (training/resilience/section.py).
May assume: model chunks wrapped by DDP, Megatron-FSDP or torch FSDP2 (config/fsdp_flags.py); process groups
initialised.
"""

from __future__ import annotations

import functools
import math
import os
import signal
import threading

import torch
from torch.distributed.tensor import DTensor

from mtmegatron.training.resilience.run_clock import exit_signal, minutes_since_start
from mtmegatron.training.resilience.section import Resilience

INJECT_ENV = "MTMEGATRON_TEST_INJECT_NAN"
STARTED_ENV = "MTMEGATRON_TEST_STARTED_MINUTES_AGO"


def _agreed(local: bool) -> bool:
    """True on every rank when any rank passes True."""
    return _agreed_each([local])[0]


def _grad_buffers(model):
    """This rank's gradients: DDP's buffers, each parameter's part of Megatron-FSDP's main-grad buffers (this
    rank's shard; not the buffers whole: their padding is never written, and megatron-core 0.16.1's temporary
    gradient buckets carry stale bytes into it, patches/megatron_fsdp_zeroed_grad_bucket.py), else torch FSDP2's
    gradients (this rank's local shards)."""
    for chunk in model:
        fsdp_buffers = getattr(chunk, "param_and_grad_buffer", None)
        if fsdp_buffers is not None:
            buffers = (g.main_grad_buffer for g in fsdp_buffers.parameter_groups if g.main_grad_buffer is not None)
            for buffer in buffers:
                if buffer.data is not None:
                    yield from (buffer.get_item(item) for item in buffer.param_idx.values())
        elif isinstance(getattr(chunk, "buffers", None), list):
            yield from (b.grad_data for b in chunk.buffers + list(getattr(chunk, "expert_parallel_buffers", [])))
        else:
            grads = (p.grad for p in chunk.parameters() if p.grad is not None)
            yield from (grad.to_local() if isinstance(grad, DTensor) else grad for grad in grads)


def _inject_nan(model, iteration: int) -> None:
    spec = os.environ.get(INJECT_ENV)
    if not spec:
        return
    iterations, _, rank = spec.partition(":")
    if torch.distributed.get_rank() == int(rank or 0) and str(iteration) in iterations.split(","):
        next(grad for grad in _grad_buffers(model) if grad.numel()).fill_(float("nan"))


def nonfinite_step(model, losses_reduced: list[dict], iteration: int) -> bool:
    """True on every rank when any rank saw an inf/nan loss or gradient in this step."""
    _inject_nan(model, iteration)
    bad = any(not math.isfinite(float(d["lm loss"])) for d in losses_reduced)
    if not bad:
        # the sum of a buffer is non-finite iff an element is (barring fp32 overflow of huge gradients), and
        # needs no buffer-sized temporary
        sums = [grad.sum(dtype=torch.float32) for grad in _grad_buffers(model)]
        bad = bool(sums) and not torch.isfinite(torch.stack(sums).sum()).item()
    return _agreed(bad)


class TerminationRequest:
    """Why the run should stop after this iteration, agreed by all ranks (config/run_control.py flags):
    ``--exit-signal-handler`` installs a handler for ``--exit-signal`` that only sets a flag (no handler without
    the flag, as Megatron-LM); ``--exit-duration-in-mins`` compares the minutes since the program started.
    ``requested()`` returns the reason, or None; it costs one all-reduce per call when either flag is given and
    none otherwise."""

    def __init__(self, resilience: Resilience):
        self._signal = exit_signal(resilience) if resilience.exit_signal_handler else None
        self._limit = resilience.exit_duration_in_mins or None  # 0: no limit, as in Megatron-LM
        self._signalled = False
        self._previous = signal.signal(self._signal, self._handle) if self._signal is not None else None
        self._started_ago = _test_started_minutes_ago()

    def _handle(self, signum, frame):
        self._signalled = True

    def requested(self) -> str | None:
        if self._signal is None and self._limit is None:
            return None
        minutes = minutes_since_start() + self._started_ago
        over_time = self._limit is not None and minutes > self._limit
        signalled, over_time = _agreed_each([self._signalled, over_time])
        if signalled:
            return f"{self._signal.name} received"
        if over_time:
            return f"--exit-duration-in-mins {self._limit} reached"
        return None

    def restore(self) -> None:
        if self._signal is not None:
            signal.signal(self._signal, self._previous)


def _agreed_each(flags: list[bool]) -> list[bool]:
    """Each flag True on every rank when any rank passes it True (one all-reduce MAX on the collective's device:
    NCCL/MCCL reduce device tensors only)."""
    from mtmegatron.backends.device import compute_device

    tensor = torch.tensor([1.0 if f else 0.0 for f in flags], device=compute_device())
    torch.distributed.all_reduce(tensor, op=torch.distributed.ReduceOp.MAX)
    return [bool(v) for v in tensor.tolist()]


def _test_started_minutes_ago() -> float:
    """Test hook ``MTMEGATRON_TEST_STARTED_MINUTES_AGO=M[:RANK]``: that rank (default 0) counts its program start
    M minutes earlier."""
    spec = os.environ.get(STARTED_ENV)
    if not spec:
        return 0.0
    minutes, _, rank = spec.partition(":")
    return float(minutes) if torch.distributed.get_rank() == int(rank or 0) else 0.0


def data_worker_init(resilience: Resilience):
    """``worker_init_fn`` for the training and validation DataLoaders: with ``--exit-signal-handler``, each worker
    ignores ``--exit-signal`` unless its rank sent it (the rank's own shutdown of its workers, and
    multiprocessing's at exit, use SIGTERM). A worker killed by the group's signal would make the rank's
    DataLoader raise (``DataLoader worker ... killed by signal``) before the rank could save. None without the
    flag: the signal ends workers and ranks alike."""
    if not resilience.exit_signal_handler:
        return None
    return functools.partial(_outlive_exit_signal, int(exit_signal(resilience)))


def _outlive_exit_signal(signum: int, worker_id: int) -> None:
    """In a DataLoader worker (its main thread): the signal is blocked in every thread and taken by one waiting
    thread, which ends the worker at once only when the rank sent it."""
    rank_pid = os.getppid()
    signal.signal(signum, signal.SIG_DFL)  # a worker forked after the rank installed its handler inherits it
    signal.pthread_sigmask(signal.SIG_BLOCK, {signum})
    threading.Thread(target=_end_on_signal_from, args=(signum, rank_pid), daemon=True,
                     name="mtmegatron-exit-signal").start()


def _end_on_signal_from(signum: int, rank_pid: int) -> None:
    while signal.sigwaitinfo({signum}).si_pid != rank_pid:
        pass
    # status 0, not death by the signal: the rank's DataLoader reports a worker killed by a signal as an error
    # when its SIGCHLD handler runs before the worker is reaped (which the delay through this thread allows)
    os._exit(0)
