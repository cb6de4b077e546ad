"""DeepSeek-V3 router top-k op: opcheck, native vs megatron's topk_routing_with_score_function (sigmoid,
expert bias, group-limited, scaling factor), float64 gradcheck of the routing probabilities."""
import pytest
import torch
from megatron.core.transformer.moe import moe_utils

from mtmegatron.ops import router

from kutil import randn


def test_opcheck(gen):
    logits = randn(gen, 6, 16, requires_grad=True)
    bias = randn(gen, 16) * 0.1
    torch.library.opcheck(router.moe_router_topk_op, (logits, bias, 4, 4, 2, 2.5))
    torch.library.opcheck(router.moe_router_topk_op, (logits, None, 1, 0, 0, 1.0))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "tokens,experts,topk,groups,group_topk,scale",
    [(1, 8, 2, None, None, None), (33, 64, 8, 8, 4, 2.5), (19, 32, 1, None, None, 1.0), (7, 256, 8, 8, 4, 2.5)],
)
def test_matches_megatron(gen, dtype, tokens, experts, topk, groups, group_topk, scale):
    logits = randn(gen, tokens, experts, dtype=dtype, requires_grad=True)
    bias = randn(gen, experts) * 0.05  # distinct biases also break bf16 score ties
    probs, rmap = router.topk_routing_with_score_function(
        logits, topk, num_groups=groups, group_topk=group_topk, scaling_factor=scale, score_function="sigmoid",
        expert_bias=bias,
    )
    logits2 = logits.detach().clone().requires_grad_()
    probs2, rmap2 = moe_utils.topk_routing_with_score_function(
        logits2, topk, num_groups=groups, group_topk=group_topk, scaling_factor=scale, score_function="sigmoid",
        expert_bias=bias,
    )
    assert torch.equal(rmap, rmap2)
    tol = dict(rtol=1e-5, atol=1e-6) if dtype == torch.float32 else dict(rtol=2 ** -6, atol=1e-2)
    torch.testing.assert_close(probs, probs2, **tol)
    g = randn(gen, tokens, experts, dtype=dtype)
    probs.backward(g)
    probs2.backward(g)
    torch.testing.assert_close(logits.grad, logits2.grad, **tol)


def test_gradcheck_float64(gen):
    logits = randn(gen, 4, 16, dtype=torch.float64, requires_grad=True)
    bias = randn(gen, 16, dtype=torch.float64) * 0.1
    assert torch.autograd.gradcheck(lambda x: router.moe_router_topk_op(x, bias, 4, 4, 2, 2.5)[0], (logits,))
