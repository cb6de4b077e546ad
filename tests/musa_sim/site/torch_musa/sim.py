"""What the simulator saw: collective counts, host-tensor refusals and per-device memory stats.

API (in a process that imported torch_musa):
  collective_counts() -> {op: {"calls": int, "bytes": int}}   bytes = input bytes this rank contributed
  refusals()          -> {op: int}                             host tensors refused by mccl
  memory()            -> {"<device>": {"allocated_bytes", "peak_allocated_bytes", "num_allocs", "num_frees"}}
  snapshot()          -> the dict written to the stats file
With ``MUSA_SIM_STATS_DIR`` set, ``snapshot()`` is written at exit to ``<dir>/rank<RANK>-pid<pid>.json``
(RANK from the environment, as torchrun sets it; "x" when unset).
"""

from __future__ import annotations

import atexit
import collections
import json
import os
import pathlib
import threading

from ._ext import ext

_lock = threading.Lock()
_counts: dict[str, dict[str, int]] = collections.defaultdict(lambda: {"calls": 0, "bytes": 0})
_refusals: dict[str, int] = collections.defaultdict(int)


def count(op: str, nbytes: int) -> None:
    with _lock:
        entry = _counts[op]
        entry["calls"] += 1
        entry["bytes"] += int(nbytes)


def refuse(op: str) -> None:
    with _lock:
        _refusals[op] += 1


def collective_counts() -> dict:
    with _lock:
        return {op: dict(v) for op, v in _counts.items()}


def refusals() -> dict:
    with _lock:
        return dict(_refusals)


def reset() -> None:
    with _lock:
        _counts.clear()
        _refusals.clear()


def memory() -> dict:
    return {str(i): ext.memory_stats(i) for i in range(ext.device_count())}


def snapshot() -> dict:
    return {
        "rank": os.environ.get("RANK"),
        "pid": os.getpid(),
        "device_count": ext.device_count(),
        "collectives": collective_counts(),
        "refusals": refusals(),
        "memory": memory(),
    }


def _write_at_exit() -> None:
    directory = os.environ.get("MUSA_SIM_STATS_DIR")
    if not directory:
        return
    path = pathlib.Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    name = f"rank{os.environ.get('RANK', 'x')}-pid{os.getpid()}.json"
    (path / name).write_text(json.dumps(snapshot(), indent=1, sort_keys=True))


atexit.register(_write_at_exit)
