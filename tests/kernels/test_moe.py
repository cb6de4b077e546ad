"""MoE permute/unpermute by routing map: opcheck, native vs megatron's moe_utils.permute/unpermute (order, probs,
gradients), 1-token and no-token edge cases, float64 gradcheck."""
import pytest
import torch
from megatron.core.transformer.moe import moe_utils

from mtmegatron.ops import moe

from kutil import BF16_ATOL, BF16_RTOL, randn


def _routing(gen, tokens, experts, topk):
    scores = torch.rand(tokens, experts, generator=gen)
    top = scores.topk(topk, dim=-1).indices
    return torch.zeros(tokens, experts, dtype=torch.bool).scatter(1, top, True)


def test_opcheck(gen):
    rm = _routing(gen, 7, 6, 2)
    x = randn(gen, 7, 10, requires_grad=True)
    probs = torch.rand(7, 6, generator=gen, requires_grad=True)
    sorted_indices, row_id_map = moe.moe_permute_index_op(rm)
    torch.library.opcheck(moe.moe_permute_op, (x, sorted_indices, row_id_map))
    permuted = randn(gen, sorted_indices.numel(), 10, requires_grad=True)
    torch.library.opcheck(moe.moe_unpermute_op, (permuted, row_id_map, probs))
    torch.library.opcheck(moe.moe_unpermute_op, (permuted, row_id_map, None))
    torch.library.opcheck(moe.moe_permute_index_op, (rm,), test_utils=("test_schema", "test_faketensor"))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("tokens,experts,topk,hidden", [(1, 4, 2, 3), (37, 16, 4, 33), (64, 64, 8, 16)])
def test_matches_megatron(gen, dtype, tokens, experts, topk, hidden):
    rm = _routing(gen, tokens, experts, topk)
    x = randn(gen, tokens, hidden, dtype=dtype, requires_grad=True)
    probs = torch.rand(tokens, experts, generator=gen).requires_grad_()
    permuted, pprobs, sorted_indices = moe.permute(x, rm, probs)
    x2, probs2 = x.detach().clone().requires_grad_(), probs.detach().clone().requires_grad_()
    permuted2, pprobs2, sorted2 = moe_utils.permute(x2, rm, probs2)
    assert torch.equal(sorted_indices, sorted2)
    assert torch.equal(permuted, permuted2)
    torch.testing.assert_close(pprobs, pprobs2)
    y = permuted * 1.5  # stand-in for the experts
    out = moe.unpermute(y, sorted_indices, x.shape, probs=probs, routing_map=rm)
    out2 = moe_utils.unpermute(permuted2 * 1.5, sorted2, x2.shape, probs=probs2, routing_map=rm)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=BF16_RTOL, atol=BF16_ATOL)
    torch.testing.assert_close(out, out2, **tol)
    g = randn(gen, tokens, hidden, dtype=dtype)
    out.backward(g)
    out2.backward(g)
    torch.testing.assert_close(x.grad, x2.grad, **tol)
    torch.testing.assert_close(probs.grad, probs2.grad, **tol)


def test_unrouted_tokens_and_empty(gen):
    rm = torch.zeros(3, 4, dtype=torch.bool)
    rm[1, 2] = True
    x = randn(gen, 3, 5)
    permuted, _, sorted_indices = moe.permute(x, rm)
    assert sorted_indices.tolist() == [1]
    out = moe.unpermute(permuted, sorted_indices, x.shape, routing_map=rm)
    torch.testing.assert_close(out, torch.stack([torch.zeros(5), x[1], torch.zeros(5)]))
    empty, _, idx = moe.permute(x, torch.zeros(3, 4, dtype=torch.bool))
    assert empty.shape == (0, 5) and idx.numel() == 0


def test_gradcheck_float64(gen):
    rm = _routing(gen, 5, 4, 2)
    sorted_indices, row_id_map = moe.moe_permute_index_op(rm)
    x = randn(gen, 5, 3, dtype=torch.float64, requires_grad=True)
    perm = randn(gen, sorted_indices.numel(), 3, dtype=torch.float64, requires_grad=True)
    probs = torch.rand(5, 4, generator=gen, dtype=torch.float64).requires_grad_()
    assert torch.autograd.gradcheck(lambda a: moe.moe_permute_op(a, sorted_indices, row_id_map), (x,))
    assert torch.autograd.gradcheck(lambda a, p: moe.moe_unpermute_op(a, row_id_map, p), (perm, probs))
