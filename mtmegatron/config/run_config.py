"""The run's configuration as one frozen value: ``parse(argv) -> RunConfig``, and ``resolved(...)`` for the facts
that only the data can tell (the tokenizer's vocabulary, the embedded corpus's path, the packing plan's rows).

A ``RunConfig`` is never changed: a later stage writes what it learns into its own copy of the values
(``copy.copy(cfg.args)``) and makes a new one with ``cfg.resolved(that_copy)``.
- ``args``: every value by its Megatron-LM dest, read-only (a ``RunArgs`` namespace, frozen): the flat view that
  the packages below read until each takes its own section;
- ``of(SectionClass)``: one concern's typed, frozen section (utils/section.py) filled from ``args`` by field name,
  e.g. ``cfg.of(Resilience)``: what a concern that has moved off ``args`` is given;
- ``sections``: the title of each flag group (``"checkpoints"``, ``"schedule"``, ...) -> its dests, in the order
  the parser declares them; ``section(title)`` -> ``{dest: value}``, read-only;
- ``sources``: dest -> where the value came from (``flag --lr`` / ``preset llama3/tiny``; absent: Megatron-LM's
  default), the start-up report's data;
- ``family``, ``task``, ``world_size``, ``preset``: what kind of run this is, decided once here.
May assume: ``arguments.parse_args`` validates (every mistake one ``ConfigError``); the family registry names each
family's task, turned by the flags (tasks/registry.py).
"""

from __future__ import annotations

import argparse
import dataclasses
from types import MappingProxyType
from typing import Mapping

from mtmegatron.config import arguments
from mtmegatron.tasks.registry import task_name
from mtmegatron.tasks.section import RunKind
from mtmegatron.utils.section import S

_NOT_FLAG_GROUPS = {"positional arguments", "options", "optional arguments"}


@dataclasses.dataclass(frozen=True)
class RunConfig:
    args: argparse.Namespace
    sections: Mapping[str, tuple[str, ...]]
    sources: Mapping[str, str]
    family: str
    task: str
    world_size: int
    preset: tuple[str, str] | None

    def section(self, title: str) -> Mapping[str, object]:
        """``{dest: value}`` of one flag group, read-only (KeyError names the known titles)."""
        if title not in self.sections:
            raise KeyError(f"no flag group {title!r} (known: {', '.join(self.sections)})")
        return MappingProxyType({dest: getattr(self.args, dest) for dest in self.sections[title]})

    def of(self, section_cls: type[S]) -> S:
        """The run's ``section_cls`` (a utils/section.py Section), filled from ``args`` by field name."""
        return section_cls.of(self.args)

    def resolved(self, args: argparse.Namespace) -> "RunConfig":
        """A new RunConfig holding ``args`` (a writable copy of ``self.args``, e.g. ``copy.copy(cfg.args)``, with
        what a later stage learned written into it), frozen; this one is unchanged."""
        return dataclasses.replace(self, args=args.freeze())

def parse(argv=None, world_size: int | None = None, for_training: bool = True) -> RunConfig:
    """The one entry: flags -> validated, frozen ``RunConfig`` (``ConfigError``: one line, the caller exits 2)."""
    parser = arguments.build_parser()
    args = arguments.parse_args(argv, world_size=world_size, for_training=for_training, parser=parser)
    return RunConfig(args=args.freeze(), sections=MappingProxyType(flag_groups(parser)),
                     sources=MappingProxyType(dict(args.value_sources)), family=args.model,
                     task=task_name(RunKind.of(args)), world_size=args.world_size, preset=args.preset_name)


def flag_groups(parser: argparse.ArgumentParser) -> dict[str, tuple[str, ...]]:
    """Group title -> the dests its flags set, for the parser's named groups (argparse's default groups left out)."""
    groups: dict[str, list[str]] = {}
    for group in parser._action_groups:
        if group.title in _NOT_FLAG_GROUPS:
            continue
        dests = groups.setdefault(group.title, [])
        dests += [a.dest for a in group._group_actions if a.dest not in dests]
    return {title: tuple(dests) for title, dests in groups.items() if dests}

