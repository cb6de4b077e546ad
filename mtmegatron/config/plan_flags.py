"""Flags of ``mtmegatron plan`` (the memory planner): its own few, the pretrain command line after them unchanged.

``--world-size N`` stands for torchrun's world (the planner runs in one process); ``--device NAME`` or
``--device-memory SIZE`` (``80GiB``, ``96GB``, ``81920MiB``, plain bytes) is what each rank's peak is measured
against; ``--json`` prints one JSON object instead of the tables; ``--search`` lists the layouts that fit
``--device`` (its FLOPs and links rank them; ``--device-memory`` may then override its memory), fastest first. Every other flag is the pretrain command line, parsed by ``mtmegatron.config.parse``
exactly as training parses it, so a command pretrain refuses is refused here with the same line.
May assume: nothing heavier than argparse is imported here.
"""

from __future__ import annotations

import argparse
import re

from mtmegatron.utils.errors import ConfigError

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def add_plan_args(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    g = p.add_argument_group("planner (the rest of the command line is pretrain's, unchanged)")
    g.add_argument("--world-size", type=int, required=True, help="ranks of the run (torchrun's world size)")
    g.add_argument("--device", default=None,
                   help="the accelerator each rank has, by name (mtmegatron/plan/devices.tsv: h100, h200, a100, "
                        "s4000, s5000); gives the memory the peak is compared with")
    g.add_argument("--device-memory", default=None, metavar="SIZE",
                   help="memory per device instead of --device (80GiB, 96GB, 81920MiB or bytes)")
    g.add_argument("--json", action="store_true", help="one JSON object: params_total and every distinct rank")
    g.add_argument("--search", action="store_true",
                   help="the five fastest layouts (TP, PP, VPP, CP, EP, DP, distributed optimizer, recompute, "
                        "micro-batch size, optimizer offload) whose predicted peak fits --device, each with its "
                        "command line; the layout flags given are replaced (docs/memory.md)")
    return p


def memory_bytes(text: str) -> int:
    """``80GiB`` -> 85899345920 (binary and decimal units, case-insensitive); one ConfigError line otherwise."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*", text or "")
    if not m or m.group(2).lower() not in _UNITS:
        raise ConfigError(f"--device-memory {text!r}: give a size such as 80GiB, 96GB, 81920MiB or a byte count")
    value = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    if value <= 0:
        raise ConfigError(f"--device-memory {text!r}: must be more than 0 bytes")
    return value


def check_plan_args(args: argparse.Namespace) -> None:
    """The planner's own rules (the pretrain flags are checked by config.parse)."""
    if args.world_size < 1:
        raise ConfigError(f"--world-size must be >= 1 (got {args.world_size})")
    if args.search and not args.device:
        raise ConfigError("--search ranks layouts by step time and needs --device (its FLOPs and links, "
                          "mtmegatron/plan/devices.tsv); --device-memory may be added to override its memory")
    if args.device and args.device_memory and not args.search:
        raise ConfigError("give --device or --device-memory, not both")
