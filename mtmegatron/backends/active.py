"""Which backend this process activated (``mtmegatron.activate``), readable from every layer without importing
the bridge. Only the bridge sets it.
May assume: nothing beyond the Backend description.
"""

from __future__ import annotations

from mtmegatron.backends.base import Backend

_active: Backend | None = None


def active_backend() -> Backend | None:
    return _active


def set_active(backend: Backend | None) -> None:
    global _active
    _active = backend
