"""--empty-unused-memory-level: Megatron-LM's levels, applied to the device module of the compute device."""

from __future__ import annotations

import types

import torch

from mtmegatron.backends import device


def test_levels_empty_the_device_cache_when_megatron_lm_does(monkeypatch):
    calls = []
    monkeypatch.setattr(device, "compute_device", lambda: torch.device("meta"))  # any device that is not the host
    monkeypatch.setattr(device.torch, "get_device_module",
                        lambda kind: types.SimpleNamespace(empty_cache=lambda: calls.append(kind)))
    assert not device.release_unused_memory(0, "step")
    assert device.release_unused_memory(1, "step") and not device.release_unused_memory(1, "eval")
    assert device.release_unused_memory(2, "eval")
    assert calls == ["meta", "meta"]


def test_nothing_to_release_on_the_host():
    assert not device.release_unused_memory(2, "step")
