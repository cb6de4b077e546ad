"""Per-device RNG of the simulated MUSA devices (``torch.musa.manual_seed`` & co).

Each device has its own CPU-algorithm generator inside the extension, independent of the host generator and
of the other devices; random ops on a musa tensor draw from its device's generator.
"""

from __future__ import annotations

import torch

from .._ext import ext
from ._utils import _get_musa_device_index
from .device import device_count




default_generators: tuple = ()  # filled by torch_musa/__init__.py after the extension is loaded


def _gen(device=None) -> torch.Generator:
    return ext.default_generator(_get_musa_device_index(device))


def get_rng_state(device="musa") -> torch.Tensor:
    return _gen(device).get_state()


def set_rng_state(new_state: torch.Tensor, device="musa") -> None:
    _gen(device).set_state(new_state.clone(memory_format=torch.contiguous_format))


def get_rng_state_all() -> list[torch.Tensor]:
    return [get_rng_state(i) for i in range(device_count())]


def set_rng_state_all(new_states) -> None:
    for i, state in enumerate(new_states):
        set_rng_state(state, i)


def manual_seed(seed: int) -> None:
    _gen().manual_seed(int(seed))


def manual_seed_all(seed: int) -> None:
    for i in range(device_count()):
        ext.default_generator(i).manual_seed(int(seed))


def seed() -> None:
    _gen().seed()


def seed_all() -> None:
    value = _gen().seed()
    for i in range(device_count()):
        ext.default_generator(i).manual_seed(value)


def initial_seed() -> int:
    return _gen().initial_seed()
