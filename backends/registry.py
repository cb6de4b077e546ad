"""Backend selection: ``--backend`` > ``MTMEGATRON_BACKEND`` > third-party entry points > auto-detect.

Auto-detect order: musa (torch_musa importable with devices), cuda (CUDA devices), else cpu.
Third-party packages register a ``Backend`` instance under the entry-point group ``mtmegatron.backends``.
May assume: torch. Never raises for a backend nobody asked for; explicit requests fail loudly.
"""

from __future__ import annotations

import os
from importlib.metadata import entry_points

from .base import Backend, BackendUnavailableError
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


def get_backend(name: str) -> Backend:
    """The backend called ``name``, checked to be usable here."""
    backends = known_backends()
    if name not in backends:
        raise BackendUnavailableError(f"unknown backend '{name}' (known: {', '.join(sorted(backends))})")
    return backends[name].require()


def select_backend(requested: str | None = None, environ=os.environ) -> Backend:
    """Pick the backend to run on, following the documented precedence."""
    if requested:
        return get_backend(requested)
    if environ.get(ENV_VAR):
        return get_backend(environ[ENV_VAR])
    for backend in third_party_backends().values():
        if backend.is_available():
            return backend
    for backend in (MUSA, CUDA, CPU):
        if backend.is_available():
            return backend
    raise AssertionError("the cpu backend is always available")
