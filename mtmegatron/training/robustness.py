"""Steps that must not reach the weights, and runs that must stop cleanly.

``nonfinite_step``: after forward/backward, every rank checks its LM losses and its gradient buffers for
inf/nan and all ranks agree (one all-reduce); such a step is skipped: no optimizer step, no LR-schedule step,
weights and optimizer state untouched. megatron-core's optimizer does this itself only under fp16 loss
scaling (where it must also lower the scale), so fp16 is left to it. ``TerminationRequest``: SIGTERM sets a
flag; all ranks agree on it after each iteration, so the loop saves a checkpoint and exits cleanly even when
only one rank was signalled.
Test hook: ``MTMEGATRON_TEST_INJECT_NAN=ITER[,ITER...][:RANK]`` fills that rank's (default 0) gradients with
nan at those iterations.
May assume: DDP-wrapped model chunks (``buffers``/``expert_parallel_buffers`` hold the gradients); process
groups initialised.
"""

from __future__ import annotations

import math
import os
import signal

import torch

INJECT_ENV = "MTMEGATRON_TEST_INJECT_NAN"


def _agreed(local: bool) -> bool:
    """True on every rank when any rank passes True (one all-reduce MAX on the collective's device: NCCL/MCCL
    reduce device tensors only)."""
    from mtmegatron.training.device import compute_device

    flag = torch.tensor([1.0 if local else 0.0], device=compute_device())
    torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
    return bool(flag.item())


def _grad_buffers(model):
    for chunk in model:
        for buffer in list(getattr(chunk, "buffers", [])) + list(getattr(chunk, "expert_parallel_buffers", [])):
            yield buffer.grad_data


def _inject_nan(model, iteration: int) -> None:
    spec = os.environ.get(INJECT_ENV)
    if not spec:
        return
    iterations, _, rank = spec.partition(":")
    if torch.distributed.get_rank() == int(rank or 0) and str(iteration) in iterations.split(","):
        next(_grad_buffers(model)).fill_(float("nan"))


def nonfinite_step(model, losses_reduced: list[dict], iteration: int) -> bool:
    """True on every rank when any rank saw an inf/nan loss or gradient in this step."""
    _inject_nan(model, iteration)
    bad = any(not math.isfinite(float(d["lm loss"])) for d in losses_reduced)
    if not bad:
        # the sum of a buffer is non-finite iff an element is (barring fp32 overflow of huge gradients), and
        # needs no buffer-sized temporary
        bad = any(not torch.isfinite(grad.sum()) for grad in _grad_buffers(model))
    return _agreed(bad)


class TerminationRequest:
    """SIGTERM -> finish the current iteration, save, exit 0 (the loop asks ``requested()`` each iteration)."""

    def __init__(self):
        self._signalled = False
        self._previous = signal.signal(signal.SIGTERM, self._handle)

    def _handle(self, signum, frame):
        self._signalled = True

    def requested(self) -> bool:
        return _agreed(self._signalled)

    def restore(self) -> None:
        signal.signal(signal.SIGTERM, self._previous)
