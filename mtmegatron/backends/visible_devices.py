"""Keep CUDA_VISIBLE_DEVICES and MUSA_VISIBLE_DEVICES (and the device max-connections variables) in agreement
before the MUSA runtime starts.

torchada copies CUDA_VISIBLE_DEVICES -> MUSA_VISIBLE_DEVICES when it is imported, but the MUSA runtime reads
MUSA_VISIBLE_DEVICES when torch_musa loads, and our availability probe (and torch's backend autoload) import
torch_musa first. So this module does the same copy itself, earlier: ``mtmegatron.backends`` runs it on import,
before torch is imported, and the musa probe runs it again right before importing torch_musa. The rule is
torchada 0.1.103's (``torchada/_visible_devices.py``): MUSA_VISIBLE_DEVICES is authoritative when set and is
copied to CUDA_VISIBLE_DEVICES; otherwise CUDA_VISIBLE_DEVICES is copied to MUSA_VISIBLE_DEVICES.
Importing torchada itself would apply all its patches, which is only wanted once MUSA is chosen.
May assume: the standard library only (it runs before torch is imported). Works with or without torchada.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import warnings

MUSA_ENV = "MUSA_VISIBLE_DEVICES"
CUDA_ENV = "CUDA_VISIBLE_DEVICES"
CUDA_MAX_CONNECTIONS, MUSA_MAX_CONNECTIONS = "CUDA_DEVICE_MAX_CONNECTIONS", "MUSA_DEVICE_MAX_CONNECTIONS"


def musa_installed() -> bool:
    """Whether torch_musa is on this machine (finds it without importing it)."""
    try:
        return importlib.util.find_spec("torch_musa") is not None
    except (ImportError, ValueError):
        return False


def sync(environ=os.environ) -> dict[str, str]:
    """Apply torchada's visibility rule to ``environ``; returns the variables it set (empty when none changed).
    Warns when it had to change MUSA_VISIBLE_DEVICES after torch_musa was already imported (too late to count)."""
    musa, cuda = environ.get(MUSA_ENV), environ.get(CUDA_ENV)
    if musa is not None:
        changed = {} if cuda == musa else {CUDA_ENV: musa}
    elif cuda is not None:
        changed = {MUSA_ENV: cuda}
    else:
        changed = {}
    environ.update(changed)
    if MUSA_ENV in changed and "torch_musa" in sys.modules:
        warnings.warn(f"{MUSA_ENV} was set from {CUDA_ENV}={cuda} after torch_musa was imported, so the MUSA "
                      f"runtime may not honour it: export {MUSA_ENV} before starting Python (or import "
                      f"mtmegatron before torch)", stacklevel=2)
    return changed


def sync_max_connections(environ=os.environ) -> dict[str, str]:
    """MUSA_DEVICE_MAX_CONNECTIONS from CUDA_DEVICE_MAX_CONNECTIONS when only the CUDA one is set: Megatron's
    overlap (TP/SP/CP communication ordered behind compute) needs one hardware queue, and Megatron-LM scripts say
    so with the CUDA name, which torchada does not translate. Returns the variables it set."""
    cuda = environ.get(CUDA_MAX_CONNECTIONS)
    if cuda is None or MUSA_MAX_CONNECTIONS in environ:
        return {}
    environ[MUSA_MAX_CONNECTIONS] = cuda
    return {MUSA_MAX_CONNECTIONS: cuda}


def sync_if_musa(environ=os.environ) -> dict[str, str]:
    """``sync`` and ``sync_max_connections`` on machines that have torch_musa; a no-op elsewhere."""
    return {**sync(environ), **sync_max_connections(environ)} if musa_installed() else {}
