"""mtmegatron.patches: version-guarded changes to megatron-core where the bridge cannot reach (logic, not
device names). ``apply_all`` applies every patch that matches the installed megatron-core and the active
backend and records why; ``applied()`` lists them (``mtmegatron patches``); ``revert_all`` undoes them.
May assume: megatron-core importable when a function here is called (not at import).
"""

from __future__ import annotations

import importlib
import os
import pkgutil

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from .base import Patch, PatchTargetMissing

SUPPORTED_MEGATRON = ">=0.16,<0.17"
FORCE_ENV = "MTMEGATRON_ALLOW_UNSUPPORTED_MEGATRON"
# comma-separated patch names left unapplied: to reproduce the megatron-core behaviour a patch fixes
DISABLE_ENV = "MTMEGATRON_DISABLE_PATCHES"

_undo: list = []
_applied: list[Patch] = []


class UnsupportedMegatronVersion(ValueError):
    pass


def megatron_version() -> str:
    from megatron.core import package_info

    return package_info.__version__


def check_megatron_version(version: str | None = None, environ=os.environ) -> str:
    """Refuse megatron-core versions the bridge and patches were not written for (env override forces)."""
    version = version or megatron_version()
    if Version(version) not in SpecifierSet(SUPPORTED_MEGATRON) and environ.get(FORCE_ENV) != "1":
        raise UnsupportedMegatronVersion(
            f"megatron-core {version} is not supported (supported: {SUPPORTED_MEGATRON}); "
            f"install megatron-core==0.16.1, or set {FORCE_ENV}=1 to try anyway"
        )
    return version


def all_patches() -> list[Patch]:
    found = []
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
        if info.name == "base":
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        found.append(module.PATCH)
    return found


def disabled_names(environ=os.environ) -> set[str]:
    """Names in $MTMEGATRON_DISABLE_PATCHES; an unknown name is an error (a typo must not pass silently)."""
    names = {n.strip() for n in environ.get(DISABLE_ENV, "").split(",") if n.strip()}
    unknown = names - {p.name for p in all_patches()}
    if unknown:
        raise ValueError(f"{DISABLE_ENV} names unknown patches: {', '.join(sorted(unknown))} "
                         f"(see `mtmegatron patches`)")
    return names


def apply_all(backend) -> list[Patch]:
    revert_all()
    version = megatron_version()
    disabled = disabled_names()
    for patch in all_patches():
        if patch.applies(version, backend.name) and patch.name not in disabled:
            _undo.append(patch.apply())
            _applied.append(patch)
    return list(_applied)


def revert_all() -> None:
    while _undo:
        _undo.pop()()
    _applied.clear()


def applied() -> list[Patch]:
    return list(_applied)


__all__ = [
    "Patch", "PatchTargetMissing", "UnsupportedMegatronVersion", "SUPPORTED_MEGATRON", "FORCE_ENV", "DISABLE_ENV",
    "disabled_names",
    "check_megatron_version", "all_patches", "apply_all", "revert_all", "applied", "megatron_version",
]
