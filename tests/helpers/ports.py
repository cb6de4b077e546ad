"""Ports for the servers tests start (TCPStore, torchrun's rendezvous), chosen below the kernel's ephemeral range.

Binding port 0 returns a port from the ephemeral range, which is also where every outgoing connection on the box
gets its local port (gloo's pairs and TCPStore clients of the other xdist worker: hundreds per distributed test).
Between the probe closing the port and the server binding it, seconds pass (a subprocess imports torch first),
and such a connection can take it: the server then fails with EADDRINUSE. Ports below the ephemeral range are
only ever handed out by an explicit bind, so a probe there stays good until the test itself binds. Each xdist
worker walks its own slice, so two workers never pick the same port; within a worker a port comes round again
only after the whole slice (thousands of picks). A port something already listens on is skipped.
"""

from __future__ import annotations

import os
import random
import socket

_LOWEST = 10000


def _ephemeral_start() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _worker_slice() -> range:
    top = max(_ephemeral_start(), _LOWEST + 1000)
    count = max(int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")), 1)
    index = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").lstrip("gw") or 0) % count
    width = (top - _LOWEST) // count
    return range(_LOWEST + index * width, _LOWEST + (index + 1) * width)


_SLICE = _worker_slice()
_next = random.Random(os.getpid()).randrange(len(_SLICE))  # another session on the box starts elsewhere


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("", port))  # all interfaces, as TCPStore binds
        except OSError:
            return False
    return True


def free_port() -> int:
    """A port nothing listens on now, from this worker's slice below the ephemeral range."""
    global _next
    for _ in range(len(_SLICE)):
        port = _SLICE[_next % len(_SLICE)]
        _next += 1
        if _bindable(port):
            return port
    raise RuntimeError(f"no free port in {_SLICE.start}-{_SLICE.stop - 1}")
