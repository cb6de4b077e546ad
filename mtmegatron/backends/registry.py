"""Backend selection: ``--backend`` > ``MTMEGATRON_BACKEND`` > third-party entry points > auto-detect.

Auto-detect order: musa (torch_musa importable with devices), cuda (CUDA devices), else cpu. It is never silent
about a surprise: a backend that is installed but unusable (no devices) is skipped with a warning saying why; a
half-installed one (torch_musa without torchada) stops auto-detect with an error naming the fix, because
training on the CPU by accident is worse than not starting. ``explain_selection`` gives the choice and every
skipped backend's reason (``mtmegatron env`` prints it).
Third-party packages register a ``Backend`` instance under the entry-point group ``mtmegatron.backends``.
May assume: torch. Never raises for a backend nobody asked for, except a half-installed one during auto-detect.
"""

from __future__ import annotations

import functools
import os
import warnings
from importlib.metadata import entry_points

from .base import Absent, Backend, BackendUnavailableError, HalfInstalled, _cached_missing
from .cpu import CPU
from .cuda import CUDA
from .musa import MUSA

ENV_VAR = "MTMEGATRON_BACKEND"
ENTRY_POINT_GROUP = "mtmegatron.backends"
BUILTIN: dict[str, Backend] = {b.name: b for b in (MUSA, CUDA, CPU)}


def third_party_backends() -> dict[str, Backend]:
    """Backends other packages registered through entry points, by name."""
    found = {}
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        backend = ep.load()
        if not isinstance(backend, Backend):
            raise TypeError(f"entry point {ep.name} = {ep.value} is not an mtmegatron Backend: {backend!r}")
        found[backend.name] = backend
    return found


def known_backends() -> dict[str, Backend]:
    return {**BUILTIN, **third_party_backends()}


@functools.cache
def backend_for(device_type: str) -> Backend:
    """The backend whose tensors live on ``device_type``; for a type no backend claims, the base answers."""
    claimed = {b.device_type: b for b in reversed(list(known_backends().values()))}
    return claimed.get(device_type) or Backend(device_type, device_type, None, "PrivateUse1", "")


def get_backend(name: str) -> Backend:
    """The backend called ``name``, checked to be usable here."""
    backends = known_backends()
    if name not in backends:
        raise BackendUnavailableError(f"unknown backend '{name}' (known: {', '.join(sorted(backends))})")
    return backends[name].require()


def _auto_detect_order() -> list[Backend]:
    return [*third_party_backends().values(), MUSA, CUDA, CPU]


def explain_selection(requested: str | None = None, environ=os.environ) -> tuple[Backend, list[tuple[str, str | None]]]:
    """The backend ``select_backend`` would pick, how it was picked, and why each other one was passed over.

    Returns ``(chosen, [(name, reason_or_None), ...])``: every known backend in auto-detect order, with the
    reason it is unusable here (None: usable). ``how_selected`` says which rule chose. Raises like
    ``select_backend`` (an unknown or unusable request, a half-installed backend during auto-detect).
    """
    return select_backend(requested, environ, warn=False), availability()


def availability() -> list[tuple[str, str | None]]:
    """``(name, reason_or_None)`` for every known backend in auto-detect order (None: usable here). Never raises
    for an unusable backend, so it can be shown even when selection fails."""
    return [(b.name, _cached_missing(b)) for b in _auto_detect_order()]


def how_selected(requested: str | None = None, environ=os.environ) -> str:
    """``--backend``, ``MTMEGATRON_BACKEND`` or ``auto-detect``: which rule decides."""
    if requested:
        return "--backend"
    if environ.get(ENV_VAR):
        return ENV_VAR
    return "auto-detect"


def select_backend(requested: str | None = None, environ=os.environ, warn: bool = True) -> Backend:
    """Pick the backend to run on, following the documented precedence (see the module docstring)."""
    if requested:
        return get_backend(requested)
    if environ.get(ENV_VAR):
        return get_backend(environ[ENV_VAR])
    skipped = []
    for backend in _auto_detect_order():
        reason = _cached_missing(backend)
        if reason is None:
            if warn and skipped:
                warnings.warn(f"mtmegatron: auto-detect chose {backend.name}; skipped "
                              + "; ".join(f"{name}: {why}" for name, why in skipped), stacklevel=2)
            return backend
        if isinstance(reason, HalfInstalled):
            raise BackendUnavailableError(f"auto-detect stopped at {backend.name}: {reason}")
        if not isinstance(reason, Absent):
            skipped.append((backend.name, reason))
    raise AssertionError("the cpu backend is always available")
