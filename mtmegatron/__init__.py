"""mtmegatron: megatron-core with the whole parallel stack on CUDA, MUSA or CPU.

``mtmegatron.activate(backend)`` selects a backend and makes megatron-core run on it (see bridge/).
May assume: torch is installed; megatron-core is imported lazily (on activate).
"""

__version__ = "0.1.0"

from .bridge import activate, active_backend, deactivate  # noqa: E402

__all__ = ["activate", "active_backend", "deactivate", "__version__"]
