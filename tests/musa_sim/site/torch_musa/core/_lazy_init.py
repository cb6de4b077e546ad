"""torch_musa.core._lazy_init stand-in: the simulated device needs no lazy runtime start, so calls run at once.

torchada imports ``_lazy_call`` from here; megatron-core reaches it as ``torch.cuda._lazy_call``.
"""

from __future__ import annotations


def is_initialized() -> bool:
    return True


def _lazy_init() -> None:
    """Nothing to start: the simulator's devices exist as soon as the extension is loaded."""


def _lazy_call(callable, **kwargs) -> None:
    callable()
