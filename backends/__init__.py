"""mtmegatron.backends: accelerator descriptions (cpu, cuda, musa) and their selection."""

from .base import Backend, BackendUnavailableError
from .registry import ENV_VAR, get_backend, known_backends, select_backend

__all__ = ["Backend", "BackendUnavailableError", "ENV_VAR", "get_backend", "known_backends", "select_backend"]
