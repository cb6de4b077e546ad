"""Helpers for the kernel tests: random tensors from a given generator and the bf16 tolerance policy.

bf16 outputs are compared after our fp32 computation is rounded once vs. the reference possibly rounding at
other points: allow 2 bf16 ulps relative (2**-7) plus a small absolute term.
"""
import torch

BF16_RTOL = 2 ** -7
BF16_ATOL = 1e-2


def randn(gen, *shape, dtype=torch.float32, requires_grad=False):
    t = torch.randn(*shape, generator=gen, dtype=torch.float64).to(dtype)
    return t.requires_grad_(requires_grad)
