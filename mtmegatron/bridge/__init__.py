"""The bridge: the one walled-off place where megatron-core's CUDA assumptions meet the active backend.

``activate(backend)`` installs the backend's bridge (cpu.py, cuda.py, musa.py) and the version-guarded
patches; it is idempotent, and ``deactivate()`` undoes it so tests can switch backends in one process.
May assume: torch and megatron-core are importable.
"""

from __future__ import annotations

from mtmegatron.backends import Backend, select_backend
from mtmegatron.backends.active import active_backend, set_active


def activate(backend: Backend | str | None = None) -> Backend:
    """Select (``--backend`` > env > entry points > auto-detect) and install a backend; returns it."""
    from mtmegatron import patches

    if not isinstance(backend, Backend):
        backend = select_backend(backend)
    if active_backend() == backend:
        return backend
    bridge = backend.bridge()  # imported first: the MUSA bridge imports torchada before megatron-core is imported
    patches.check_megatron_version()
    deactivate()
    bridge.install(backend)
    patches.apply_all(backend)
    set_active(backend)
    return backend


def deactivate() -> None:
    backend = active_backend()
    if backend is None:
        return
    from mtmegatron import patches

    patches.revert_all()
    backend.bridge().uninstall()
    set_active(None)
