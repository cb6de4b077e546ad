"""``mtmegatron.ops.grouped_mm.gmm`` (the grouped matmul behind ``--moe-grouped-gemm`` without TE): both paths
(``torch._grouped_mm``, per-group loop) against a per-group reference written here, forward and both gradients,
with an empty group, ``trans_b``, fp32 and bf16; the path choice follows dtype and 16-byte stride alignment.
"""

from __future__ import annotations

import pytest
import torch

from mtmegatron.ops import grouped_mm


def reference(a, b, sizes, trans_b=False):
    out, start = [], 0
    for e, n in enumerate(sizes):
        w = b[e].t() if trans_b else b[e]
        out.append(a[start:start + n] @ w)
        start += n
    return torch.cat(out)


CASES = {  # (rows per group, K, N, dtype, expected path on torch 2.13 CPU)
    "aligned_fp32": ([3, 0, 5, 8], 16, 32, torch.float32, "torch._grouped_mm"),
    "aligned_bf16": ([4, 4, 0, 8], 16, 24, torch.bfloat16, "torch._grouped_mm"),
    "misaligned_fp32": ([2, 5, 1, 0], 10, 6, torch.float32, "loop"),
    "fp64": ([3, 0, 5, 8], 16, 32, torch.float64, "loop"),
}


@pytest.mark.parametrize("trans_b", [False, True], ids=["b", "b_t"])
@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_gmm_matches_per_group_matmuls(case, trans_b):
    sizes, k, n, dtype, path = CASES[case]
    torch.manual_seed(0)
    a = torch.randn(sum(sizes), k, dtype=dtype, requires_grad=True)
    b = torch.randn(len(sizes), *((n, k) if trans_b else (k, n)), dtype=dtype, requires_grad=True)
    if path == "torch._grouped_mm" and not grouped_mm._torch_grouped_mm_works("cpu", dtype):
        pytest.skip("this torch has no torch._grouped_mm on CPU")  # torch < 2.8: the loop serves every call
    assert grouped_mm.grouped_mm_path(a, b, trans_b) == path
    grad = torch.randn(sum(sizes), n, dtype=dtype)
    out = grouped_mm.gmm(a, b, torch.tensor(sizes), trans_b=trans_b)
    out.backward(grad)
    a2, b2 = a.detach().clone().requires_grad_(), b.detach().clone().requires_grad_()
    ref = reference(a2, b2, sizes, trans_b)
    ref.backward(grad)
    tol = dict(atol=1e-2, rtol=1e-2) if dtype == torch.bfloat16 else dict(atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out, ref, **tol)
    torch.testing.assert_close(a.grad, a2.grad, **tol)
    torch.testing.assert_close(b.grad, b2.grad, **tol)
    assert b.grad[sizes.index(0)].abs().max() == 0  # the empty group's weight gets a zero gradient


def test_expanded_gradient_reaches_torch_grouped_mm():
    """``out.sum().backward()`` hands a zero-stride gradient, which torch._grouped_mm's backward refuses."""
    a = torch.randn(8, 16, requires_grad=True)
    b = torch.randn(2, 16, 16, requires_grad=True)
    grouped_mm.gmm(a, b, torch.tensor([3, 5])).sum().backward()
    torch.testing.assert_close(a.grad[:3], b.detach()[0].sum(1).expand(3, 16))
