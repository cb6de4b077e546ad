"""The accelerators ``mtmegatron plan --device NAME`` knows, read from devices.tsv, and the links between them, read
from links.tsv (both editable; one line each with its source): memory per device, dense BF16 peak, the model-FLOPs
efficiency ``--search`` assumes, devices per node and the names of the links within a node, between nodes and to
the host. ``device_memory`` turns the planner flags into bytes.
May assume: the flags passed config/plan_flags.check_plan_args.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from mtmegatron.config.plan_flags import memory_bytes
from mtmegatron.utils.errors import ConfigError

TABLE = Path(__file__).with_name("devices.tsv")
LINKS = Path(__file__).with_name("links.tsv")


@dataclasses.dataclass(frozen=True)
class Device:
    name: str
    memory_bytes: int
    bf16_flops: float  # dense peak, FLOP/s
    efficiency: float  # model-FLOPs utilisation assumed by --search
    per_node: int
    intra_link: str
    inter_link: str
    host_link: str
    description: str
    source: str


@dataclasses.dataclass(frozen=True)
class Link:
    name: str
    bytes_per_s: float  # one direction, one device
    description: str
    source: str


def _rows(path: Path) -> list[list[str]]:
    return [line.split("\t") for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")]


def known_devices(path: Path = TABLE) -> dict[str, Device]:
    devices = {}
    for name, memory, tflops, eff, per_node, intra, inter, host, description, source in _rows(path):
        devices[name] = Device(name, int(memory), float(tflops) * 1e12, float(eff), int(per_node), intra, inter, host,
                               description, source)
    return devices


def known_links(path: Path = LINKS) -> dict[str, Link]:
    return {name: Link(name, float(gbps) * 1e9, description, source) for name, gbps, description, source in _rows(path)}


def device_memory(args) -> tuple[int | None, str | None]:
    """(bytes per device, what they are) from ``--device`` or ``--device-memory``; (None, None) without either."""
    if args.device_memory:
        return memory_bytes(args.device_memory), f"--device-memory {args.device_memory}"
    if args.device:
        devices = known_devices()
        if args.device.lower() not in devices:
            raise ConfigError(f"--device {args.device}: unknown device (known: {', '.join(devices)}; or give "
                              "--device-memory)")
        device = devices[args.device.lower()]
        return device.memory_bytes, device.description
    return None, None
