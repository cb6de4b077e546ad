"""Rewrites accelerator device literals to the CPU while the CPU bridge is installed.

Megatron-core writes ``device='cuda'``, ``device=torch.cuda.current_device()`` (an int), ``tensor.cuda()``,
``tensor.to('cuda')`` and compares ``param.type()`` with ``'torch.cuda.FloatTensor'``. A TorchFunctionMode
sees every torch call with its arguments, so these are remapped in one place instead of patched per file:
device arguments naming cuda (or a bare index) become ``cpu``, ``.cuda()``/``.pin_memory()`` and
``record_stream`` are identities, ``pin_memory=True`` is dropped, and ``Tensor.type()`` reports the
accelerator type name (on this backend the CPU is the accelerator).
The mode is per thread and is entered on the thread that activates the bridge (the training thread; CPU
autograd runs backward on the same thread). torch's dispatch pops a mode while its handler runs, so the
autograd entry points (``Tensor.backward``, ``torch.autograd.backward/grad``) are re-run with the mode pushed
again: otherwise every custom ``Function.backward`` in megatron-core would allocate on "cuda" unremapped.
torch 2.13 re-runs them with ``torch.overrides.redispatch_function``; older torch (2.7 to 2.12, which lack it)
gets the same effect from ``engine_under_mode``: the autograd engine's one Python entry (which ``backward`` and
``grad`` both reach) is wrapped to push the mode again when the dispatcher has popped it.
May assume: torch >= 2.7 (``torch.autograd._engine_run_backward``).
"""

from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode

_CPU = torch.device("cpu")
_ACCELERATOR_TYPES = ("cuda",)


def _is_accelerator(device) -> bool:
    if isinstance(device, torch.device):
        return device.type in _ACCELERATOR_TYPES
    if isinstance(device, str):
        return device.split(":", 1)[0] in _ACCELERATOR_TYPES
    return isinstance(device, int) and not isinstance(device, bool)


def _remap_to_args(args):
    """Tensor.to(device, ...) / Tensor.to(other_tensor) / Tensor.to(dtype): remap a positional device."""
    if len(args) > 1 and _is_accelerator(args[1]):
        return (args[0], _CPU, *args[2:])
    return args


_AUTOGRAD_ENTRIES = (torch.Tensor.backward, torch.autograd.backward, torch.autograd.grad)


_REDISPATCH = getattr(torch.overrides, "redispatch_function", None)


def supported() -> str | None:
    """None if this torch can run the mode, else why not."""
    if _REDISPATCH is None and not callable(getattr(torch.autograd, "_engine_run_backward", None)):
        return (f"the cpu bridge needs torch.overrides.redispatch_function or torch.autograd._engine_run_backward, "
                f"and torch {torch.__version__} has neither")
    return None


def engine_under_mode(mode: TorchFunctionMode):
    """On a torch without redispatch_function: runs the autograd engine under ``mode`` when the dispatcher has popped
    it (inside the mode's own handler for ``backward``/``grad``). Returns the function that undoes it; None where
    redispatch_function serves instead."""
    if _REDISPATCH is not None:
        return None
    engine = torch.autograd._engine_run_backward

    def run_under_mode(*args, **kwargs):
        if mode in torch.overrides._get_current_function_mode_stack():
            return engine(*args, **kwargs)
        with mode:
            return engine(*args, **kwargs)

    torch.autograd._engine_run_backward = run_under_mode

    def restore():
        torch.autograd._engine_run_backward = engine
    return restore


class CpuDeviceMode(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in _AUTOGRAD_ENTRIES and _REDISPATCH is not None:
            with self:  # redispatch skips this mode once, so this does not recurse
                return _REDISPATCH(func, types, args, kwargs or {})
        if kwargs:
            device = kwargs.get("device")
            if device is not None and _is_accelerator(device):
                kwargs = {**kwargs, "device": _CPU}
            if kwargs.get("pin_memory"):
                kwargs = {**kwargs, "pin_memory": False}
        else:
            kwargs = {}
        special = _SPECIAL.get(func)
        if special is not None:
            return special(func, args, kwargs)
        return func(*args, **kwargs)


def _identity(func, args, kwargs):
    return args[0]


def _ignore(func, args, kwargs):
    return None


def _to(func, args, kwargs):
    return func(*_remap_to_args(args), **kwargs)


def _type(func, args, kwargs):
    if len(args) == 1 and not kwargs:
        name = func(*args)
        return name.replace("torch.", "torch.cuda.", 1) if not name.startswith("torch.cuda.") else name
    return func(*args, **kwargs)


_SPECIAL = {
    torch.Tensor.cuda: _identity,
    torch.Tensor.pin_memory: _identity,
    torch.Tensor.record_stream: _ignore,
    torch.Tensor.to: _to,
    torch.Tensor.type: _type,
}
