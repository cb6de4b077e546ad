"""Shared helpers for the kernel tests: fresh random generators and the bf16 tolerance policy.

May assume: mtmegatron is installed (editable) with its native CPU library built.
"""
import pytest
import torch

import mtmegatron.ops  # noqa: F401  (declares the ops, loads mtmegatron._C)

# bf16 outputs are compared after the fp32 computation is rounded once (ours) vs. possibly at different points
# (reference / megatron): allow 2 bf16 ulps relative (2**-7) plus a small absolute term.
BF16_RTOL = 2 ** -7
BF16_ATOL = 1e-2


@pytest.fixture
def gen():
    """A generator with a fresh seed per test (printed on failure by pytest's output capture)."""
    seed = int(torch.randint(0, 2**31 - 1, (1,)).item())
    print(f"seed={seed}")
    return torch.Generator().manual_seed(seed)


def randn(gen, *shape, dtype=torch.float32, requires_grad=False):
    t = torch.randn(*shape, generator=gen, dtype=torch.float64).to(dtype)
    return t.requires_grad_(requires_grad)
