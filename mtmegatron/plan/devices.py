"""The accelerators ``mtmegatron plan --device NAME`` knows: name -> memory per device, read from devices.tsv
(editable; one line per device with its source). ``device_memory`` turns the planner flags into bytes.
May assume: the flags passed config/plan_flags.check_plan_args.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from mtmegatron.config.plan_flags import memory_bytes
from mtmegatron.utils.errors import ConfigError

TABLE = Path(__file__).with_name("devices.tsv")


@dataclasses.dataclass(frozen=True)
class Device:
    name: str
    memory_bytes: int
    description: str
    source: str


def known_devices(path: Path = TABLE) -> dict[str, Device]:
    devices = {}
    for line in path.read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        name, memory, description, source = line.split("\t")
        devices[name] = Device(name, int(memory), description, source)
    return devices


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
