"""mtmegatron: megatron-core with the whole parallel stack on CUDA, MUSA or CPU.

``mtmegatron.activate(backend)`` selects a backend and makes megatron-core run on it (see bridge/).
May assume: torch is installed; megatron-core is imported lazily (on activate), and its ``jit_fuser`` compiles a
helper on first call rather than at import (utils/deferred_imports.py, installed here, before megatron-core loads).
"""

__version__ = "0.1.0"

from .utils.deferred_imports import install as _install_deferred_imports  # noqa: E402

_install_deferred_imports()

from .bridge import activate, active_backend, deactivate  # noqa: E402

__all__ = ["activate", "active_backend", "deactivate", "__version__"]
