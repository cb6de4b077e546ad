"""rms_norm / add_rms_norm: opcheck, native vs reference (fp32, bf16), vs torch's F.rms_norm, float64 gradcheck."""
import pytest
import torch
import torch.nn.functional as F

from mtmegatron.ops import norm

from kutil import BF16_ATOL, BF16_RTOL, randn


@pytest.mark.parametrize("shape", [(1, 1, 7), (3, 2, 67), (5, 257)])
def test_opcheck(gen, shape):
    x = randn(gen, *shape, requires_grad=True)
    w = randn(gen, shape[-1], requires_grad=True)
    r = randn(gen, *shape, requires_grad=True)
    torch.library.opcheck(norm.rms_norm_op, (x, w, 1e-5))
    torch.library.opcheck(norm.add_rms_norm_op, (x, r, w, 1e-6))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matches_reference_and_torch(gen, dtype):
    x, w = randn(gen, 3, 5, 131, dtype=dtype), randn(gen, 131, dtype=dtype)
    y, rstd = norm.rms_norm_op(x, w, 1e-5)
    y_ref, rstd_ref = norm.rms_norm_reference(x, w, 1e-5)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=BF16_RTOL, atol=BF16_ATOL)
    torch.testing.assert_close(y, y_ref, **tol)
    torch.testing.assert_close(rstd, rstd_ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(y.float(), F.rms_norm(x.float(), (131,), w.float(), 1e-5), **tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_backward_matches_autograd_of_unfused(gen, dtype):
    x = randn(gen, 4, 1, 99, dtype=dtype, requires_grad=True)
    r = randn(gen, 4, 1, 99, dtype=dtype, requires_grad=True)
    w = randn(gen, 99, dtype=torch.float32, requires_grad=True)  # fp32 weight with bf16 activations
    g, gs = randn(gen, 4, 1, 99, dtype=dtype), randn(gen, 4, 1, 99, dtype=dtype)
    y, s = norm.rms_norm(x, w, 1e-5, residual=r)
    torch.autograd.backward([y, s], [g, gs])
    x2, r2, w2 = (t.detach().clone().requires_grad_() for t in (x, r, w))
    s2 = (x2 + r2).float()
    y2 = F.rms_norm(s2, (99,), w2, 1e-5)
    torch.autograd.backward([y2, s2], [g.float(), gs.float()])
    tol = dict(rtol=1e-4, atol=1e-4) if dtype == torch.float32 else dict(rtol=2 ** -6, atol=5e-2)
    torch.testing.assert_close(x.grad.float(), x2.grad.float(), **tol)
    torch.testing.assert_close(r.grad.float(), r2.grad.float(), **tol)
    torch.testing.assert_close(w.grad, w2.grad, **tol)


def test_gradcheck_float64(gen):
    x = randn(gen, 3, 13, dtype=torch.float64, requires_grad=True)
    r = randn(gen, 3, 13, dtype=torch.float64, requires_grad=True)
    w = randn(gen, 13, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b: norm.rms_norm(a, b, 1e-6), (x, w))
    assert torch.autograd.gradcheck(lambda a, c, b: norm.rms_norm(a, b, 1e-6, residual=c), (x, r, w))
