"""rope on [s, b, h, d]: opcheck, native vs megatron's _apply_rotary_pos_emb_bshd (rotate-half, interleaved, MLA,
partial rotary, mscale), float64 gradcheck."""
import pytest
import torch
from megatron.core.models.common.embeddings.rope_utils import _apply_rotary_pos_emb_bshd

from mtmegatron.ops import rope

from kutil import BF16_ATOL, BF16_RTOL, randn


def _freqs(gen, s, rot, interleaved, batch=1):
    base = randn(gen, s, batch, 1, rot // 2)
    if interleaved:
        return torch.stack([base, base], dim=-1).reshape(s, batch, 1, rot)
    return torch.cat([base, base], dim=-1)


@pytest.mark.parametrize("layout", [rope.ROTATE_HALF, rope.INTERLEAVED, rope.MLA])
def test_opcheck(gen, layout):
    t = randn(gen, 5, 2, 3, 10, requires_grad=True)
    torch.library.opcheck(rope.rope_op, (t, randn(gen, 5, 1, 1, 6), layout, 1.0))


@pytest.mark.parametrize("interleaved,mla", [(False, False), (True, False), (False, True)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("s,b,h,d,rot", [(1, 1, 1, 4, 4), (9, 3, 5, 24, 16), (6, 2, 3, 20, 20)])
def test_matches_megatron(gen, interleaved, mla, dtype, s, b, h, d, rot):
    t = randn(gen, s, b, h, d, dtype=dtype, requires_grad=True)
    f = _freqs(gen, s, rot, interleaved, batch=b if s % 2 else 1)
    out = rope.fused_apply_rotary_pos_emb(t, f, interleaved=interleaved, multi_latent_attention=mla, mscale=1.3)
    t2 = t.detach().float().requires_grad_()
    ref = _apply_rotary_pos_emb_bshd(t2, f, rotary_interleaved=interleaved, multi_latent_attention=mla, mscale=1.3)
    g = randn(gen, s, b, h, d, dtype=dtype)
    out.backward(g)
    ref.backward(g.float())
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=BF16_RTOL, atol=BF16_ATOL)
    torch.testing.assert_close(out.float(), ref, **tol)
    torch.testing.assert_close(t.grad.float(), t2.grad, **tol)


@pytest.mark.parametrize("layout", [rope.ROTATE_HALF, rope.INTERLEAVED, rope.MLA])
def test_gradcheck_float64(gen, layout):
    t = randn(gen, 3, 2, 2, 10, dtype=torch.float64, requires_grad=True)
    f = randn(gen, 3, 2, 1, 8, dtype=torch.float64)
    assert torch.autograd.gradcheck(lambda x: rope.rope_op(x, f, layout, 0.7), (t,))
