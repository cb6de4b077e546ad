"""mtmegatron.backends: accelerator descriptions (cpu, cuda, musa) and their selection.

The visible-devices sync runs first, before anything here imports torch (torch may autoload torch_musa,
which starts the MUSA runtime): see visible_devices.py.
"""

from . import visible_devices

visible_devices.sync_if_musa()

from .base import Absent, Backend, BackendUnavailableError, HalfInstalled  # noqa: E402
from .registry import ENV_VAR, explain_selection, get_backend, how_selected, known_backends, select_backend  # noqa: E402

__all__ = ["Absent", "Backend", "BackendUnavailableError", "ENV_VAR", "HalfInstalled", "explain_selection",
           "get_backend", "how_selected", "known_backends", "select_backend"]
