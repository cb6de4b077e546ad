"""Which FP8 GEMMs ``torch._scaled_mm`` runs on this rank's device, and which executor a run gets.

The ``scaled_mm`` executor makes one call per GEMM in two forms (executors.py):
- tensor-wise scales (delayed / tensorwise recipes), fp32 output;
- 1x128 / 128x128 block scales (blockwise recipe, DeepSeek-V3's layout) through ``torch.nn.functional.scaled_mm``.
Row-wise scales are not used (their fp32 output is refused by cuBLAS before 12.9 on sm90 and everywhere else); a
blockwise GEMM without block scales runs emulated (one fp32 GEMM on dequantized operands). The backend's rules
decide first (``Backend.scaled_mm_rules`` on ``Backend.facts``, its *current* device: set the rank's device
first); every mode they allow is then tried once on the device (E4M3 x E4M3 and E5M2 x E4M3, the operand pairs of
forward and dgrad/wgrad), a refusal kept as the reason. ``select_executor``: the first of ``Backend.fp8_executors``
that runs.
May assume: torch >= 2.7.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from mtmegatron.backends.base import DeviceFacts
from mtmegatron.backends.registry import backend_for

from .executors import EXECUTORS, QTensor, gemm_scaled_mm_blockwise


@dataclass(frozen=True)
class ScaledMMSupport:
    """Why each form cannot run here (None: it runs)."""

    tensorwise_missing: str | None
    blockwise_missing: str | None


def rules(facts: DeviceFacts) -> ScaledMMSupport:
    """What the device's facts allow, before any call (the backend's rules)."""
    if not hasattr(torch, "_scaled_mm"):
        return ScaledMMSupport("this torch has no _scaled_mm", "this torch has no _scaled_mm")
    return ScaledMMSupport(*backend_for(facts.device_type).scaled_mm_rules(facts))


def _first_line(error: Exception) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def try_tensorwise(device: torch.device) -> None:
    one = torch.ones((), device=device)
    b = torch.ones(32, 32, device=device).to(torch.float8_e4m3fn)
    for a_dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        a = torch.ones(32, 32, device=device).to(a_dtype)
        torch._scaled_mm(a, b.t(), scale_a=one, scale_b=one, out_dtype=torch.float32)


def try_blockwise(device: torch.device) -> None:
    m, n, k = 128, 128, 512  # E4M3 only: the form the executor calls (block_scaled_shape_fits)
    a = QTensor(torch.ones(m, k, device=device).to(torch.float8_e4m3fn), torch.ones(m, k // 128, device=device),
                (1, 128))
    b = QTensor(torch.ones(n, k, device=device).to(torch.float8_e4m3fn),
                torch.ones(n // 128, k // 128, device=device), (128, 128))
    gemm_scaled_mm_blockwise(a, b)


def probe(facts: DeviceFacts) -> ScaledMMSupport:
    """The rules, confirmed by one tiny call of each allowed form on the device of ``facts``."""
    allowed = rules(facts)
    found = {}
    for form, missing, attempt in (("tensor-wise", allowed.tensorwise_missing, try_tensorwise),
                                   ("block-scaled", allowed.blockwise_missing, try_blockwise)):
        if missing is None:
            try:
                attempt(facts.device)
            except (RuntimeError, NotImplementedError, TypeError, ValueError) as e:
                missing = f"torch._scaled_mm refused a {form} probe on {facts.device}: {_first_line(e)}"
        found[form] = missing
    return ScaledMMSupport(found["tensor-wise"], found["block-scaled"])


@functools.cache
def scaled_mm_support(facts: DeviceFacts) -> ScaledMMSupport:
    """``probe`` once per device (per process)."""
    return probe(facts)


def executor_missing(name: str, backend) -> str | None:
    """Why executor ``name`` cannot run on ``backend``'s current device, or None when it can."""
    if name == "transformer_engine":
        return backend.transformer_engine_missing()
    if name == "scaled_mm":
        return scaled_mm_support(backend.facts()).tensorwise_missing
    if name == "emulated":
        return None
    return f"unknown FP8 executor '{name}' (known: {', '.join(EXECUTORS)})"


def select_executor(backend, requested: str = "auto", skip: tuple[str, ...] = ()) -> str:
    """``requested`` if this backend offers it and it runs, else (``auto``) the first one not in ``skip`` that
    runs."""
    if requested != "auto":
        if requested not in backend.fp8_executors:
            raise ValueError(f"--fp8-executor {requested} is not offered by backend {backend.name} "
                             f"(offers: {', '.join(backend.fp8_executors)})")
        reason = executor_missing(requested, backend)
        if reason:
            raise ValueError(f"--fp8-executor {requested}: {reason}")
        return requested
    for name in backend.fp8_executors:
        if name not in skip and executor_missing(name, backend) is None:
            return name
    raise ValueError(f"no FP8 executor runs on backend {backend.name}")
