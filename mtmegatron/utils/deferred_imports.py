"""What megatron-core does while it is imported that a run may never need: deferred to first use, or left out.

1. ``jit_fuser`` compiles a fused helper on its first call instead of while megatron-core imports.

megatron-core decorates about 40 fused helpers with ``megatron.core.jit.jit_fuser``, which is ``torch.compile`` on
torch >= 2.2, as its modules are imported. The first ``torch.compile(fn)`` initialises TorchDynamo: 1.2-1.7 s of
every process that imports megatron-core, whether or not a helper ever runs (on the CPU backend they do not, or run
eagerly: patches/*_without_compile.py; on MUSA dynamo is off: backends/musa_runtime.py). ``install()`` arranges
that, right after ``megatron.core.jit`` executes, a ``jit_fuser`` that megatron-core set to ``torch.compile`` becomes
``compile_on_first_call``: the helper is handed to ``torch.compile`` when it is first called, so a run that uses it
gets the same compiled function, and one that does not never starts TorchDynamo. Anything else megatron-core or the
user chose (``disable_jit_fuser``'s no-op, ``torch.jit.script`` on an old torch) is left alone.
The decorated helper keeps ``__wrapped__`` (the plain function), as the patches that run a helper eagerly expect.
2. ``leave_out(name)``: a module megatron-core imports only to know it is there (``wandb``: 0.6 s, by its inference
contexts) is reported absent in a process that will not use it (the pretrain command without ``--wandb-project``,
the converter), as megatron-core handles it being absent.
May assume: imported before megatron-core (mtmegatron/__init__.py installs it); stdlib and torch only.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import sys

TARGET = "megatron.core.jit"


def compile_on_first_call(fn):
    """``@jit_fuser`` with ``torch.compile`` called on the first call (then the compiled function every call)."""
    compiled = None

    @functools.wraps(fn)
    def call(*args, **kwargs):
        nonlocal compiled
        if compiled is None:
            import torch

            compiled = torch.compile(fn)
        return compiled(*args, **kwargs)

    return call


def defer(module) -> None:
    """Replace ``module.jit_fuser`` when megatron-core made it ``torch.compile``."""
    import torch

    if getattr(module, "jit_fuser", None) is torch.compile:
        module.jit_fuser = compile_on_first_call


class _ThenLoader(importlib.abc.Loader):
    """The real loader of the target, then ``defer`` on the executed module; everything else is the real loader's."""

    def __init__(self, inner):
        self.inner = inner

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module):
        self.inner.exec_module(module)
        defer(module)

    def __getattr__(self, name):  # get_source, get_filename, ... for inspect and linecache
        return getattr(self.inner, name)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname != TARGET:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _ThenLoader(spec.loader)
        return spec


def leave_out(name: str) -> None:
    """``import name`` fails in this process from now on (unless it is already imported): for a whole process, never
    inside a test's own process."""
    if name not in sys.modules:
        sys.modules[name] = None


def install() -> None:
    """Idempotent. When megatron-core's ``jit`` module is already imported, ``defer`` it directly (helpers
    decorated before that keep ``torch.compile``)."""
    if TARGET in sys.modules:
        defer(sys.modules[TARGET])
        return
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
