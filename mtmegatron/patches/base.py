"""What a patch is: a named, version-guarded, reversible change to megatron-core behaviour.

Each patch module under mtmegatron.patches defines one ``PATCH = Patch(...)``: its target (a dotted name),
why it exists, the megatron-core versions it applies to, which backends need it, and ``apply`` returning an
undo callable. A patch whose target is gone raises PatchTargetMissing instead of silently doing nothing.
May assume: megatron-core is importable.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Callable

from packaging.specifiers import SpecifierSet
from packaging.version import Version

_MISSING = object()


class PatchTargetMissing(RuntimeError):
    pass


@dataclass(frozen=True)
class Patch:
    name: str
    target: str
    reason: str
    versions: str  # a PEP 440 specifier over megatron-core's version
    apply: Callable[[], Callable[[], None]]
    backends: tuple[str, ...] = field(default=("cpu", "cuda", "musa"))

    def applies(self, megatron_version: str, backend_name: str) -> bool:
        return backend_name in self.backends and Version(megatron_version) in SpecifierSet(self.versions)


def resolve(dotted: str):
    """Import ``pkg.module:attr.attr`` (or ``pkg.module``) and return (owner, attribute name)."""
    module_name, _, attr_path = dotted.partition(":")
    owner = importlib.import_module(module_name)
    *parents, name = attr_path.split(".")
    for parent in parents:
        owner = getattr(owner, parent)
    return owner, name


def current(dotted: str):
    """The object ``dotted`` names now; PatchTargetMissing if megatron-core no longer has it."""
    owner, name = resolve(dotted)
    found = owner.__dict__.get(name, _MISSING) if hasattr(owner, "__dict__") else getattr(owner, name, _MISSING)
    if found is _MISSING:
        raise PatchTargetMissing(f"{dotted} no longer exists in this megatron-core; the patch needs review")
    return found


def set_attr(dotted: str, value, must_exist: bool = True) -> Callable[[], None]:
    """Set ``dotted`` to ``value``; returns the undo. Raises PatchTargetMissing if the target vanished."""
    owner, name = resolve(dotted)
    old = owner.__dict__.get(name, _MISSING) if hasattr(owner, "__dict__") else getattr(owner, name, _MISSING)
    if must_exist and old is _MISSING:
        raise PatchTargetMissing(f"{dotted} no longer exists in this megatron-core; the patch needs review")
    setattr(owner, name, value)

    def undo():
        if old is _MISSING:
            delattr(owner, name)
        else:
            setattr(owner, name, old)

    return undo


def undo_in_reverse(undos: list[Callable[[], None]]) -> Callable[[], None]:
    """One undo for a patch made of several ``set_attr`` calls: theirs, last first."""

    def undo():
        for u in reversed(undos):
            u()

    return undo
