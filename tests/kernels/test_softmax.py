"""Fused attention softmaxes: opcheck, native vs megatron's FusedScaleMaskSoftmax unfused path (padding and
causal masks, fully masked rows), float64 gradcheck."""
import pytest
import torch
from megatron.core.fusions.fused_softmax import FusedScaleMaskSoftmax
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.utils import attention_mask_func

from mtmegatron.ops import softmax

from kutil import BF16_ATOL, BF16_RTOL, randn


def _megatron(mask_type, dtype, scale):
    return FusedScaleMaskSoftmax(
        input_in_fp16=False, input_in_bf16=dtype == torch.bfloat16, attn_mask_type=mask_type,
        scaled_masked_softmax_fusion=False, mask_func=attention_mask_func, softmax_in_fp32=True, scale=scale,
    )


def test_opcheck(gen):
    x = randn(gen, 2, 3, 5, 7, requires_grad=True)
    mask = torch.rand(2, 1, 5, 7, generator=gen) > 0.5
    torch.library.opcheck(softmax.scaled_masked_softmax_op, (x, mask, 0.3))
    torch.library.opcheck(softmax.scaled_masked_softmax_op, (x, None, 1.0))
    torch.library.opcheck(softmax.scaled_upper_triang_masked_softmax_op, (randn(gen, 4, 6, 6, requires_grad=True), 0.5))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("mask_batch", [1, 3])
def test_masked_matches_megatron(gen, dtype, mask_batch):
    x = randn(gen, 3, 4, 9, 37, dtype=dtype, requires_grad=True)
    mask = torch.rand(mask_batch, 1, 9, 37, generator=gen) > 0.6
    mask[0, 0, 2, :] = True  # one fully masked row: uniform probabilities, zero gradient
    y = softmax.scaled_masked_softmax(x, mask, 0.125)
    x2 = x.detach().clone().requires_grad_()
    y2 = _megatron(AttnMaskType.padding, dtype, 0.125)(x2, mask)
    g = randn(gen, *x.shape, dtype=dtype)
    y.backward(g)
    y2.backward(g)
    tol = dict(rtol=1e-5, atol=1e-6) if dtype == torch.float32 else dict(rtol=BF16_RTOL, atol=BF16_ATOL)
    torch.testing.assert_close(y, y2, **tol)
    torch.testing.assert_close(x.grad, x2.grad, **tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_causal_matches_megatron(gen, dtype):
    x = randn(gen, 2, 3, 17, 17, dtype=dtype, requires_grad=True)
    y = softmax.scaled_upper_triang_masked_softmax(x.view(6, 17, 17), 0.7).view(2, 3, 17, 17)
    x2 = x.detach().clone().requires_grad_()
    causal = torch.ones(17, 17, dtype=torch.bool).triu(1).view(1, 1, 17, 17)  # megatron's default mask is
    y2 = _megatron(AttnMaskType.causal, dtype, 0.7)(x2, causal)  # built on 'cuda', so pass the same one
    g = randn(gen, *x.shape, dtype=dtype)
    y.backward(g)
    y2.backward(g)
    tol = dict(rtol=1e-5, atol=1e-6) if dtype == torch.float32 else dict(rtol=BF16_RTOL, atol=BF16_ATOL)
    torch.testing.assert_close(y, y2, **tol)
    torch.testing.assert_close(x.grad, x2.grad, **tol)
    assert (y.view(6, 17, 17).triu(1) == 0).all()


def test_gradcheck_float64(gen):
    x = randn(gen, 2, 2, 3, 5, dtype=torch.float64, requires_grad=True)
    mask = torch.rand(2, 1, 3, 5, generator=gen) > 0.5
    assert torch.autograd.gradcheck(lambda a: softmax.scaled_masked_softmax(a, mask, 0.5), (x,))
    xc = randn(gen, 3, 4, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a: softmax.scaled_upper_triang_masked_softmax(a, 1.5), (xc,))
