"""SDPADotProductAttention against an explicit float64 softmax reference, outputs and gradients.

Cases: causal, padding mask (megatron's boolean mask, True = masked), GQA (KV heads not repeated by us), MLA
head dims (q/k 24, v 16), THD packed sequences (cu_seqlens, with and without padded offsets); plus dropout
under megatron's RNG tracker and the megatron-core local module on the same inputs. Tolerance: 1e-10 absolute
in float64 (measured ~1e-15: only summation order differs). One single-rank process group per module.
"""

from __future__ import annotations

import math

import pytest
import torch
from megatron.core.packed_seq_params import PackedSeqParams
from megatron.core.transformer.enums import AttnMaskType

ATOL = 1e-10


def _config(heads=4, groups=4, kv_channels=16, dropout=0.0):
    from megatron.core.transformer import TransformerConfig

    return TransformerConfig(num_layers=1, hidden_size=heads * kv_channels, num_attention_heads=heads,
                             num_query_groups=groups, kv_channels=kv_channels, attention_dropout=dropout,
                             params_dtype=torch.float64, use_cpu_initialization=True)


def _module(config, mask_type=AttnMaskType.causal, **kwargs):
    from mtmegatron.attention.core import SDPADotProductAttention

    return SDPADotProductAttention(config, layer_number=1, attn_mask_type=mask_type, attention_type="self",
                                   **kwargs)


def reference(q, k, v, scale, masked=None, causal=False):
    """Explicit softmax in float64. q [s, b, hq, d], k/v [s, b, hk, d]; masked [b|1, 1, sq, sk], True = masked."""
    groups = q.shape[2] // k.shape[2]
    k, v = k.repeat_interleave(groups, dim=2), v.repeat_interleave(groups, dim=2)
    scores = torch.einsum("qbhd,kbhd->bhqk", q.double(), k.double()) * scale
    if causal:
        scores = scores.masked_fill(torch.ones(q.shape[0], k.shape[0], dtype=torch.bool).triu(1), float("-inf"))
    if masked is not None:
        scores = scores.masked_fill(masked, float("-inf"))
    out = torch.einsum("bhqk,kbhd->qbhd", torch.softmax(scores, dim=-1), v.double())
    return out.reshape(out.shape[0], out.shape[1], -1)


def _inputs(s, b, hq, hk, dk, dv, seed=0):
    g = torch.Generator().manual_seed(seed)
    make = lambda *shape: torch.randn(*shape, generator=g, dtype=torch.float64).requires_grad_()  # noqa: E731
    return make(s, b, hq, dk), make(s, b, hk, dk), make(s, b, hk, dv)


def _check(ours_fn, ref_fn, inputs, seed=1):
    out = ours_fn(*inputs)
    ref = ref_fn(*inputs)
    assert out.shape == ref.shape
    assert (out - ref).abs().max().item() < ATOL
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed), dtype=out.dtype)
    ours_grads = torch.autograd.grad(out, inputs, grad)
    ref_grads = torch.autograd.grad(ref, inputs, grad)
    for name, a, r in zip("qkv", ours_grads, ref_grads):
        assert (a - r).abs().max().item() < ATOL, f"d{name} differs by {(a - r).abs().max().item():.2e}"


@pytest.mark.parametrize("hq,hk,dk,dv", [(4, 4, 16, 16), (4, 2, 16, 16), (4, 1, 16, 16), (2, 2, 24, 16)],
                         ids=["mha", "gqa2", "mqa", "mla_dims"])
def test_causal_matches_reference(single_rank, hq, hk, dk, dv):
    config = _config(heads=hq, groups=hk, kv_channels=dk)
    module = _module(config, k_channels=dk, v_channels=dv)
    scale = 1 / math.sqrt(dk)
    _check(lambda q, k, v: module(q, k, v, None),
           lambda q, k, v: reference(q, k, v, scale, causal=True), _inputs(12, 2, hq, hk, dk, dv))


def test_padding_mask_and_softmax_scale(single_rank):
    config = _config(heads=4, groups=2)
    module = _module(config, mask_type=AttnMaskType.padding, softmax_scale=0.37)
    masked = torch.zeros(2, 1, 1, 10, dtype=torch.bool)
    masked[0, ..., 7:] = True  # sample 0: its last three keys are padding
    masked[1, ..., :2] = True
    _check(lambda q, k, v: module(q, k, v, masked),
           lambda q, k, v: reference(q, k, v, 0.37, masked=masked), _inputs(10, 2, 4, 2, 16, 16))


def test_explicit_mask_wins_over_causal_type(single_rank):
    """megatron's softmax uses a given mask as is, also for a causal layer: so do we."""
    module = _module(_config())
    masked = torch.ones(10, 10, dtype=torch.bool).triu(1)
    masked[:, 0] = True
    masked[0, 0] = False
    masked = masked.expand(2, 1, 10, 10)
    _check(lambda q, k, v: module(q, k, v, masked),
           lambda q, k, v: reference(q, k, v, 0.25, masked=masked), _inputs(10, 2, 4, 4, 16, 16))


@pytest.mark.parametrize("padded", [False, True], ids=["thd", "thd_padded"])
def test_packed_thd_matches_per_sequence_reference(single_rank, padded):
    config = _config(heads=4, groups=2)
    module = _module(config)
    lengths = [5, 3, 8]
    cu = torch.tensor([0, 5, 8, 16], dtype=torch.int32)
    cu_padded = torch.tensor([0, 6, 10, 18], dtype=torch.int32) if padded else None
    total = 18 if padded else 16
    params = PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu, cu_seqlens_q_padded=cu_padded,
                             cu_seqlens_kv_padded=cu_padded, max_seqlen_q=8, max_seqlen_kv=8)
    starts = (cu_padded if padded else cu)[:-1].tolist()

    def ref(q, k, v):  # [t, h, d] (attention.py squeezes the batch dim for THD)
        out = torch.zeros(q.shape[0], 4 * 16, dtype=torch.float64)
        pieces = []
        for start, n in zip(starts, lengths):
            part = reference(q[start:start + n, None], k[start:start + n, None], v[start:start + n, None],
                             0.25, causal=True)[:, 0]
            pieces.append((start, n, part))
        for start, n, part in pieces:
            out = out.index_copy(0, torch.arange(start, start + n), part)
        return out

    q, k, v = (t.detach()[:, 0].clone().requires_grad_() for t in _inputs(total, 1, 4, 2, 16, 16))
    _check(lambda q, k, v: module(q, k, v, None, packed_seq_params=params), ref, (q, k, v))


def test_same_result_as_megatron_local_attention(single_rank):
    """On megatron-core's own module the local-spec result (fp64, GQA, causal) is what we reproduce."""
    from megatron.core.transformer.dot_product_attention import DotProductAttention

    config = _config(heads=4, groups=2)
    ours = _module(config)
    theirs = DotProductAttention(config, layer_number=1, attn_mask_type=AttnMaskType.causal, attention_type="self")
    q, k, v = _inputs(12, 2, 4, 2, 16, 16, seed=3)
    a, b = ours(q, k, v, None), theirs(q, k, v, None)
    assert (a - b).abs().max().item() < 1e-10


def test_dropout_uses_the_model_parallel_rng_tracker(single_rank):
    from megatron.core import tensor_parallel

    module = _module(_config(dropout=0.5))
    q, k, v = (t.detach() for t in _inputs(16, 2, 4, 4, 16, 16))
    module.eval()
    clean = module(q, k, v, None)
    module.train()
    tensor_parallel.model_parallel_cuda_manual_seed(7)
    default_before = torch.get_rng_state()
    first = module(q, k, v, None)
    assert torch.equal(torch.get_rng_state(), default_before), "dropout drew from the default generator"
    tensor_parallel.model_parallel_cuda_manual_seed(7)
    again = module(q, k, v, None)
    assert torch.equal(first, again), "same tracker seed, different dropout"
    assert not torch.allclose(first, clean), "dropout had no effect in training mode"
    assert (module.eval()(q, k, v, None) - clean).abs().max().item() == 0.0
