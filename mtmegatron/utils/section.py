"""Typed, frozen sections of a run's configuration: the values one concern reads, by their flag dests.

A concern below ``config/`` declares ``class Mine(Section)`` with one field per value it reads, each field named
as the flag's dest (``--rerun-mode`` -> ``rerun_mode``), and takes ``Mine`` instead of the run's args; the entry
point fills it once with ``Mine.of(args)``, as Megatron-LM fills megatron-core's config dataclasses by field name.
A section has no defaults (it is the values of one run, all of them) and converts nothing: each value is what the
parser and its checks made it. Sections compare and hash by value: two runs with the same values have equal
sections.
May assume: nothing beyond the standard library (the dests are checked against the parser in tests/flags/).
"""

from __future__ import annotations

import dataclasses
from typing import TypeVar

S = TypeVar("S", bound="Section")


@dataclasses.dataclass(frozen=True)
class Section:
    """Base of the sections: subclasses are ``@dataclasses.dataclass(frozen=True)`` with fields and no defaults."""

    @classmethod
    def of(cls: type[S], values) -> S:
        """The section filled field by field from ``values``' attributes of the same names (a RunArgs, a
        Namespace, another object); AttributeError names the section and the missing field."""
        filled = {}
        for field in dataclasses.fields(cls):
            try:
                filled[field.name] = getattr(values, field.name)
            except AttributeError:
                raise AttributeError(f"{cls.__name__}.of: the values have no {field.name!r} "
                                     f"(section {cls.__module__}.{cls.__name__})") from None
        return cls(**filled)
