"""Routes requests for NCCL to the active backend's collective library.

Megatron-LM scripts (and some megatron-core paths) name ``"nccl"``; on MUSA that must be ``"mccl"`` and on
the CPU backend ``"gloo"``. ``torch.distributed.init_process_group`` and ``new_group`` are wrapped so a
backend argument of ``"nccl"`` becomes the active backend's collective library. May assume: torch.distributed.
"""

from __future__ import annotations

import functools

import torch.distributed as dist

_NCCL = "nccl"
_originals: dict[str, object] = {}


def _translate(backend, target: str):
    if isinstance(backend, str) and backend.lower() == _NCCL:
        return target
    return backend


def _wrap(fn, target: str, position: int):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if "backend" in kwargs:
            kwargs["backend"] = _translate(kwargs["backend"], target)
        elif len(args) > position:
            args = (*args[:position], _translate(args[position], target), *args[position + 1 :])
        return fn(*args, **kwargs)

    wrapper.__mtmegatron_wrapped__ = fn
    return wrapper


def install(target: str) -> None:
    """Make ``"nccl"`` mean ``target`` for process-group creation. Idempotent."""
    uninstall()
    if target == _NCCL:
        return
    for name, position in (("init_process_group", 0), ("new_group", 2)):
        _originals[name] = getattr(dist, name)
        setattr(dist, name, _wrap(_originals[name], target, position))


def uninstall() -> None:
    for name, fn in _originals.items():
        setattr(dist, name, fn)
    _originals.clear()
