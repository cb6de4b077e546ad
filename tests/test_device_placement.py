"""Batches and collective scratch tensors go to the active backend's device for LOCAL_RANK (not always the
host): checked with a stand-in backend whose device is ``meta``, which no host code path produces by accident."""

from __future__ import annotations

import torch

import mtmegatron.backends.active as bridge
from mtmegatron.backends import get_backend
from mtmegatron.backends.device import compute_device, to_compute_device


def test_no_active_backend_means_cpu(monkeypatch):
    monkeypatch.setattr(bridge, "_active", None)
    assert compute_device() == torch.device("cpu")


def test_batch_follows_the_backend_device_and_local_rank(monkeypatch):
    seen = []

    class MetaBackend:
        def device(self, local_rank=0):
            seen.append(local_rank)
            return torch.device("meta")

    monkeypatch.setattr(bridge, "_active", MetaBackend())
    monkeypatch.setenv("LOCAL_RANK", "3")
    batch = {"tokens": torch.arange(6).view(2, 3), "note": "kept"}
    moved = to_compute_device(batch)
    assert moved["tokens"].device.type == "meta" and moved["tokens"].shape == (2, 3)
    assert moved["note"] == "kept" and batch["tokens"].device.type == "cpu"
    assert seen == [3]


def test_cpu_backend_device_is_the_host(monkeypatch):
    monkeypatch.setattr(bridge, "_active", get_backend("cpu"))
    assert compute_device() == torch.device("cpu")
