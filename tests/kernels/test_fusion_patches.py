"""patches/rope_fusion_without_te.py and patches/moe_fusion_without_te.py: with the patches applied (TE absent),
megatron-core's fused code paths (apply_rope_fusion, moe_permute_fusion, moe_router_fusion) run mtmegatron's
ops and give the unfused results; the patches only touch names that megatron reads behind those flags."""
import inspect
import re

import pytest
import torch

from mtmegatron import patches
from helpers.patch_state import no_backend_around_the_test  # noqa: F401 (autouse)
from mtmegatron.backends.cpu import CPU

from kutil import randn

moe_utils = pytest.importorskip("megatron.core.transformer.moe.moe_utils")
rope_utils = pytest.importorskip("megatron.core.models.common.embeddings.rope_utils")
if getattr(moe_utils, "HAVE_TE", False) or rope_utils.fused_apply_rotary_pos_emb is not None:
    pytest.skip("TransformerEngine is installed: these patches are no-ops", allow_module_level=True)


@pytest.fixture
def patched():
    patches.apply_all(CPU)
    yield
    patches.revert_all()


def _config(**kw):
    from megatron.core.transformer import TransformerConfig

    base = dict(num_layers=1, hidden_size=32, num_attention_heads=4, use_cpu_initialization=True)
    return TransformerConfig(**{**base, **kw})


def test_moe_utils_reads_have_te_only_behind_fused_flags():
    """The MoE patch sets HAVE_TE: every read of it must be `if not HAVE_TE or fused_X is None` inside a
    `fused` branch. Fails when a megatron-core release adds another reader (then review the patch)."""
    src = inspect.getsource(moe_utils)
    reads = [m.start() for m in re.finditer(r"\bHAVE_TE\b", src)]
    gated = re.findall(r"if not HAVE_TE or fused_\w+ is None:", src)
    assert len(reads) - 2 == len(gated) == 8  # two bindings in the import try/except


def test_flags_are_rejected_without_patch_and_accepted_with_it(patched):
    cfg = _config(apply_rope_fusion=True, num_moe_experts=4, moe_permute_fusion=True, moe_router_fusion=True)
    assert cfg.apply_rope_fusion and cfg.moe_permute_fusion
    patches.revert_all()
    with pytest.raises(ValueError):
        _config(apply_rope_fusion=True)
    with pytest.raises((ValueError, ImportError)):
        _config(num_moe_experts=4, moe_permute_fusion=True)


def test_rope_fusion_runs_our_op_and_matches_unfused(patched, gen, monkeypatch):
    calls = []
    fused = rope_utils.fused_apply_rotary_pos_emb
    monkeypatch.setattr(rope_utils, "fused_apply_rotary_pos_emb", lambda *a, **k: calls.append(1) or fused(*a, **k))
    t = randn(gen, 6, 2, 4, 16, requires_grad=True)
    base = randn(gen, 6, 1, 1, 8)
    freqs = torch.cat([base, base], -1)
    no_cp = object()  # only the packed-sequence (thd) branch reads the context-parallel group
    got = rope_utils.apply_rotary_pos_emb(t, freqs, _config(apply_rope_fusion=True), cp_group=no_cp)
    want = rope_utils.apply_rotary_pos_emb(t, freqs, _config(apply_rope_fusion=False), cp_group=no_cp)
    assert calls == [1]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    g = randn(gen, *t.shape)
    (ga,) = torch.autograd.grad(got, t, g)
    (gb,) = torch.autograd.grad(want, t, g)
    torch.testing.assert_close(ga, gb, rtol=1e-5, atol=1e-5)


def test_fused_permute_unpermute_match_unfused(patched, gen):
    tokens, experts, topk, hidden = 19, 6, 2, 10
    x = randn(gen, tokens, hidden, requires_grad=True)
    scores = torch.rand(tokens, experts, generator=gen)
    top = scores.topk(topk, -1).indices
    routing_map = torch.zeros(tokens, experts, dtype=torch.bool).scatter(1, top, True)
    probs = torch.zeros(tokens, experts).scatter(1, top, torch.rand(tokens, topk, generator=gen))
    num_out = int(routing_map.sum())
    for p in (None, probs):
        pf, ppf, idx_f = moe_utils.permute(x, routing_map, probs=p, num_out_tokens=num_out, fused=True)
        pu, ppu, idx_u = moe_utils.permute(x, routing_map, probs=p, num_out_tokens=num_out, fused=False)
        torch.testing.assert_close(pf, pu)
        if p is not None:
            torch.testing.assert_close(ppf, ppu)
        w = randn(gen, num_out, hidden)
        of = moe_utils.unpermute(pf * w, idx_f, x.shape, probs=p, routing_map=routing_map, fused=True)
        ou = moe_utils.unpermute(pu * w, idx_u, x.shape, probs=p, routing_map=routing_map, fused=False)
        torch.testing.assert_close(of, ou, rtol=1e-5, atol=1e-6)
        g = randn(gen, tokens, hidden)
        (gf,) = torch.autograd.grad(of, x, g)
        (gu,) = torch.autograd.grad(ou, x, g)
        torch.testing.assert_close(gf, gu, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="num_out_tokens"):
        moe_utils.permute(x, routing_map, num_out_tokens=num_out - 1, fused=True)


def test_fused_sort_chunks_match_unfused(patched, gen):
    x = randn(gen, 15, 3, requires_grad=True)
    probs = torch.rand(15, generator=gen)
    split_sizes = torch.tensor([4, 0, 3, 2, 6])
    order = torch.tensor([2, 0, 4, 1, 3])
    got, gp = moe_utils.sort_chunks_by_idxs(x, split_sizes, order, probs=probs, fused=True)
    want, wp = moe_utils.sort_chunks_by_idxs(x, split_sizes, order, probs=probs, fused=False)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(gp, wp)
    assert torch.equal(moe_utils.sort_chunks_by_idxs(x, split_sizes, order, fused=True)[0], want)


@pytest.mark.parametrize("score_function", ["sigmoid", "softmax"])
def test_fused_router_matches_unfused(patched, gen, score_function):
    logits = randn(gen, 12, 8, requires_grad=True)
    bias = torch.rand(8, generator=gen) * 0.1 if score_function == "sigmoid" else None
    kw = dict(topk=2, num_groups=4 if bias is not None else None, group_topk=2 if bias is not None else None,
              scaling_factor=1.5 if bias is not None else None, score_function=score_function, expert_bias=bias)
    pf, mf = moe_utils.topk_routing_with_score_function(logits, fused=True, **kw)
    pu, mu = moe_utils.topk_routing_with_score_function(logits, fused=False, **kw)
    assert torch.equal(mf, mu)
    torch.testing.assert_close(pf, pu, rtol=1e-5, atol=1e-6)
    mf, sf = moe_utils.compute_routing_scores_for_aux_loss(logits, 2, score_function, fused=True)
    mu, su = moe_utils.compute_routing_scores_for_aux_loss(logits, 2, score_function, fused=False)
    assert torch.equal(mf, mu) and torch.equal(sf, su)
    tpe = mf.sum(0).float()
    lf = moe_utils.switch_load_balancing_loss_func(sf, tpe, 12, 2, 8, 0.01, fused=True)
    lu = moe_utils.switch_load_balancing_loss_func(su, tpe, 12, 2, 8, 0.01, fused=False)
    torch.testing.assert_close(lf, lu)
