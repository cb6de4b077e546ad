"""Stand-in ``torch_musa`` for the simulated MUSA device. Test path only: never installed for users.

Importing it loads the simulator extension (tests/musa_sim/csrc), renames PrivateUse1 to "musa", generates
``Tensor.musa()``/``is_musa`` (and the Module/Storage/PackedSequence methods), sets ``torch.version.musa``
(torchada's MUSA signal), installs this package as ``torch.musa`` (the real torch_musa does the same, which is
why torchada finds ``torch.musa.core.stream``), and registers the "mccl" distributed backend for "musa".
Renaming PrivateUse1 cannot be undone: import this only in a process meant to run on the simulated device.

May assume: torch >= 2.7 and the extension built for this torch (see tests/musa_sim/build.py).
"""

from __future__ import annotations

import sys

import torch

from ._ext import ext

__version__ = "2.7.1+musa_sim"  # the torch_musa release MUSA users are pinned to (see docs/REFERENCE)
SIMULATED = True

torch.utils.rename_privateuse1_backend("musa")

from . import amp, core, sim, utils  # noqa: E402
from .core import _lazy_init, _utils, memory, random, stream as streams  # noqa: E402
from .core._lazy_init import _lazy_call, _lazy_init, is_initialized  # noqa: E402,F811
from .core.device import (  # noqa: E402
    _is_compiled, current_device, device, device_count, device_of, get_arch_list, get_device_capability,
    get_device_name, get_device_properties, is_available, set_device, synchronize,
)
from .core.memory import (  # noqa: E402
    MemPool, MUSAPluggableAllocator, use_mem_pool,
    empty_cache, max_memory_allocated, max_memory_cached, max_memory_reserved, mem_get_info, memory_allocated,
    memory_cached, memory_reserved, memory_stats, memory_summary, reset_accumulated_memory_stats,
    reset_max_memory_allocated, reset_max_memory_cached, reset_peak_memory_stats,
)
from .core.random import (  # noqa: E402
    get_rng_state, get_rng_state_all, initial_seed, manual_seed, manual_seed_all, seed, seed_all, set_rng_state,
    set_rng_state_all,
)
from .core.stream import (  # noqa: E402
    Event, ExternalStream, Stream, StreamContext, current_stream, default_stream, set_stream, stream,
)
from .core.tensor_types import *  # noqa: E402,F401,F403
from .distributed import mccl as _mccl  # noqa: E402

default_generators = tuple(ext.default_generator(i) for i in range(ext.device_count()))
random.default_generators = default_generators


OutOfMemoryError = torch.OutOfMemoryError


def get_amp_supported_dtype() -> list:
    """Needed by torch.autocast("musa"): the dtypes autocast may cast to on this device."""
    return [torch.float16, torch.bfloat16]


def _is_in_bad_fork() -> bool:
    """The simulated device has no runtime a fork could break."""
    return False


def is_bf16_supported(including_emulation: bool = True) -> bool:
    return True

_get_device_index = _utils._get_musa_device_index

torch.version.musa = "4.2.0"
torch._register_device_module("musa", sys.modules[__name__])
torch.utils.generate_methods_for_privateuse1_backend(
    for_tensor=True, for_module=True, for_packed_sequence=True, for_storage=True
)
_mccl.register()


def _autoload() -> None:
    """Entry point in the ``torch.backends`` group: ``import torch`` imports this package, as with torch_musa."""
