"""Streams and events of the simulated MUSA device (``torch_musa.core.stream``, which torchada imports).

Built on ``torch.Stream``/``torch.Event``, i.e. on the extension's DeviceGuardImpl: streams are per-thread
bookkeeping (ids, current stream per device), events record a host timestamp. Everything is synchronous, so
stream/event hazards cannot show here.
"""

from __future__ import annotations

import time

import torch

from ._utils import _get_musa_device_index


class Stream(torch.Stream):
    """``torch.musa.Stream``: a simulated stream on a musa device."""

    def __new__(cls, device=None, priority: int = 0, stream_id=None, device_index=None, device_type=None, **kwargs):
        if stream_id is not None:
            return super().__new__(cls, stream_id=stream_id, device_index=device_index, device_type=device_type)
        index = _get_musa_device_index(device)
        return super().__new__(cls, device=torch.device("musa", index), priority=priority)

    @property
    def musa_stream(self) -> int:
        return self.stream_id

    def __repr__(self):
        return f"<torch.musa.Stream device=musa:{self.device_index} musa_stream={self.stream_id}>"


class ExternalStream(Stream):
    def __new__(cls, stream_ptr: int, device=None, **kwargs):
        index = _get_musa_device_index(device)
        return super().__new__(cls, stream_id=int(stream_ptr), device_index=index, device_type=_device_type())


class Event(torch.Event):
    """``torch.musa.Event``: a ``torch.Event`` on musa (as torch_musa's is, so ``Stream.wait_event`` and
    ``record_event`` take it); records a host timestamp, times in milliseconds (``torch.Event.elapsed_time`` takes
    only a plain ``torch.Event`` as its argument, so the timing is kept here)."""

    def __new__(cls, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False):
        event = super().__new__(cls, device="musa", enable_timing=enable_timing, blocking=blocking,
                                interprocess=interprocess)
        event._timing, event._recorded_at = enable_timing, None
        return event

    def record(self, stream=None):
        super().record(current_stream() if stream is None else stream)
        self._recorded_at = time.perf_counter()

    def wait(self, stream=None):
        super().wait(current_stream() if stream is None else stream)

    def elapsed_time(self, end: "Event") -> float:
        if not (self._timing and end._timing):
            raise RuntimeError("Both events must be created with argument 'enable_timing=True'")
        if self._recorded_at is None or end._recorded_at is None:
            raise RuntimeError("Both events must be recorded before calculating elapsed time")
        return (end._recorded_at - self._recorded_at) * 1000.0


def _device_type() -> int:
    return torch.Stream(device="musa").device_type


def _wrap(s: torch.Stream) -> Stream:
    return Stream(stream_id=s.stream_id, device_index=s.device_index, device_type=s.device_type)


def current_stream(device=None) -> Stream:
    return _wrap(torch.accelerator.current_stream(_get_musa_device_index(device)))


def default_stream(device=None) -> Stream:
    return Stream(stream_id=0, device_index=_get_musa_device_index(device), device_type=_device_type())


def set_stream(stream: torch.Stream) -> None:
    if stream is not None:
        torch.accelerator.set_stream(stream)


class StreamContext:
    """``with torch.musa.stream(s):`` makes ``s`` current on its device for the body."""

    def __init__(self, stream):
        self.stream = stream
        self.previous = None

    def __enter__(self):
        if self.stream is not None:
            self.previous = current_stream(self.stream.device_index)
            set_stream(self.stream)
        return self.stream

    def __exit__(self, *exc):
        if self.previous is not None:
            set_stream(self.previous)
        return False


def stream(stream) -> StreamContext:
    return StreamContext(stream)
