"""adam_step: opcheck and several steps against torch.optim.AdamW on odd-sized fp32 tensors (fp32 and bf16
grads)."""
import pytest
import torch

from mtmegatron.ops import adam

from kutil import randn


def test_opcheck(gen):
    params = [randn(gen, 5), randn(gen, 3, 7)]
    grads = [randn(gen, 5), randn(gen, 3, 7)]
    m = [torch.zeros(5), torch.zeros(3, 7)]
    v = [torch.zeros(5), torch.zeros(3, 7)]
    torch.library.opcheck(adam.adam_step_op, (params, grads, m, v, 1e-3, 0.9, 0.95, 1e-8, 0.1, 1))


@pytest.mark.parametrize("grad_dtype", [torch.float32, torch.bfloat16])
def test_matches_torch_adamw(gen, grad_dtype):
    shapes = [(1,), (17,), (33, 65), (70001,)]  # the last spans two CPU chunks
    params = [randn(gen, *s) for s in shapes]
    ref = [p.clone().requires_grad_() for p in params]
    opt = torch.optim.AdamW(ref, lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    m = [torch.zeros_like(p) for p in params]
    v = [torch.zeros_like(p) for p in params]
    for step in range(1, 4):
        grads = [randn(gen, *s).to(grad_dtype) for s in shapes]
        adam.adam_step(params, grads, m, v, lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, step=step)
        for p, g in zip(ref, grads):
            p.grad = g.float()
        opt.step()
    for p, r in zip(params, ref):
        torch.testing.assert_close(p, r.detach(), rtol=1e-5, atol=1e-6)
