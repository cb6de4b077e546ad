"""Fixtures for the kernel tests: a generator with a fresh seed per test (printed, so a failure can be replayed).

May assume: mtmegatron is installed (editable) with its native CPU library built.
"""
import pytest
import torch

import mtmegatron.ops  # noqa: F401  (declares the ops, loads mtmegatron._C)


@pytest.fixture
def gen():
    seed = int(torch.randint(0, 2**31 - 1, (1,)).item())
    print(f"seed={seed}")
    return torch.Generator().manual_seed(seed)
