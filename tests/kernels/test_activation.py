"""swiglu on cat([gate, up]): opcheck, native vs megatron's glu formula, float64 gradcheck."""
import pytest
import torch
import torch.nn.functional as F

from mtmegatron.ops import activation

from kutil import BF16_ATOL, BF16_RTOL, randn


def _megatron_glu(x):
    gate, up = torch.chunk(x, 2, dim=-1)
    return F.silu(gate) * up


@pytest.mark.parametrize("shape", [(1, 1, 2), (3, 2, 46), (7, 130)])
def test_opcheck(gen, shape):
    torch.library.opcheck(activation.swiglu_op, (randn(gen, *shape, requires_grad=True),))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_forward_backward_match_unfused(gen, dtype):
    x = randn(gen, 5, 3, 2 * 45, dtype=dtype, requires_grad=True)
    g = randn(gen, 5, 3, 45, dtype=dtype)
    y = activation.swiglu(x)
    y.backward(g)
    x2 = x.detach().float().requires_grad_()
    y2 = _megatron_glu(x2)
    y2.backward(g.float())
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=BF16_RTOL, atol=BF16_ATOL)
    torch.testing.assert_close(y.float(), y2, **tol)
    torch.testing.assert_close(x.grad.float(), x2.grad, **tol)


def test_gradcheck_float64(gen):
    x = randn(gen, 3, 2, 22, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(activation.swiglu, (x,))
