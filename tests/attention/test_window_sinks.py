"""Sliding-window attention and attention sinks in mtmegatron's attention against a dense reference.

The reference materialises the full ``[sq, sk]`` mask from the definition (megatron-core 0.16.1 / TE: query ``i``
sees keys ``i - left <= j <= i + right``, and ``j <= i`` on a causal layer) and the softmax with the sink column
appended (megatron's ``SoftmaxOne``), computed in float64 from the float32 inputs. Compared at 1e-6 (relative to each
tensor's largest entry, absolute below 1), forward and backward (q, k, v and the sink), float32 inputs:
- one rank, ``SDPADotProductAttention``: window only, learnable sink only, off-by-one, window + sink + GQA,
  THD packed sequences (windows per sequence); megatron-core's own local ``DotProductAttention`` on the same config
  and parameters (window + learnable sink); which layers get the window (``window_attn_skip_freq`` int and list);
- CP2 (ONE spawn): ring (``p2p``) and all-gather attention with windows that cut across chunks, sinks, GQA, and
  THD under CP; the sink's gradient summed over the CP ranks;
- a tiny llama3 pretrain with ``--window-size 4,0 --window-attn-skip-freq 2 --softmax-type learnable``;
- on the simulated MUSA device: the window + sink SDPA path and the ring's masked block on device tensors.
"""

from __future__ import annotations

import pytest
import torch
from megatron.core.packed_seq_params import PackedSeqParams
from megatron.core.transformer.enums import AttnMaskType

from helpers.ranks import run_ranks

ATOL = 1e-6


def dense(q, k, v, scale, q_pos, k_pos, window=None, causal=True, sink=None):
    """Explicit attention in float64, returned in q's dtype. q [b, hq, sq, d], k/v [b, hk, sk, d]; positions 1-D."""
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
    allowed = torch.tensor([[(not causal or j <= i)
                             and (window is None or window[0] < 0 or j >= i - window[0])
                             and (window is None or window[1] < 0 or j <= i + window[1])
                             for j in k_pos.tolist()] for i in q_pos.tolist()])
    scores = (q.double() @ k.double().transpose(-1, -2) * scale).masked_fill(~allowed, float("-inf"))
    if sink is not None:
        column = sink.double().view(1, -1, 1, 1).expand(*scores.shape[:-1], 1)
        probs = torch.softmax(torch.cat([scores, column], -1), -1)[..., :-1]
    else:
        probs = torch.softmax(scores, -1)
    return (probs @ v.double()).to(q.dtype)


def _max_diff(got, want):
    """Largest difference over the tensors, each relative to its reference's largest entry (absolute below 1):
    float32 holds ~7 digits, and the k/v gradients (sums over many query rows) reach ~10."""
    return max(((a.double() - b.double()).abs().max() / b.double().abs().max().clamp(min=1)).item()
               for a, b in zip(got, want))


# ---------------------------------------------------------------- one rank


def _config(heads=4, groups=2, kv=8, window=None, skip=None, softmax="vanilla", num_layers=1):
    from megatron.core.transformer import TransformerConfig

    return TransformerConfig(num_layers=num_layers, hidden_size=heads * kv, num_attention_heads=heads,
                             num_query_groups=groups, kv_channels=kv, attention_dropout=0.0,
                             params_dtype=torch.float32, use_cpu_initialization=True, window_size=window,
                             window_attn_skip_freq=skip, softmax_type=softmax)


def _module(config, layer_number=1):
    from mtmegatron.attention.core import SDPADotProductAttention

    return SDPADotProductAttention(config, layer_number=layer_number, attn_mask_type=AttnMaskType.causal,
                                   attention_type="self")


def _sbhd(*shape, g):
    return torch.randn(*shape, generator=g).requires_grad_()


def _check_module(module, q, k, v, ref_fn, packed=None):
    """module(q, k, v) [s, b, h, d] vs ref_fn(q, k, v, sink) (same layout out), values and gradients."""
    sink = module.softmax_offset if isinstance(module.softmax_offset, torch.nn.Parameter) else None
    leaves = [q, k, v] + ([sink] if sink is not None else [])
    out = module(q, k, v, None, packed_seq_params=packed)
    ref = ref_fn(q, k, v, module.softmax_offset)
    assert out.shape == ref.shape
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(5))
    got = [out] + list(torch.autograd.grad(out, leaves, dout))
    want = [ref] + list(torch.autograd.grad(ref, leaves, dout))
    error = _max_diff(got, want)
    assert error < ATOL, f"max abs difference {error:.2e}"
    return error


def _ref_sbhd(scale, window, s):
    pos = torch.arange(s)

    def ref(q, k, v, sink):
        t = [x.permute(1, 2, 0, 3) for x in (q, k, v)]
        out = dense(*t, scale, pos, pos, window, True, sink)
        return out.permute(2, 0, 1, 3).reshape(s, q.shape[1], -1)
    return ref


@pytest.mark.parametrize("window, softmax, groups", [
    ((3, 0), "vanilla", 4), (None, "learnable", 4), (None, "off-by-one", 4), ((5, 0), "learnable", 2),
    ((2, 1), "learnable", 1)], ids=["window", "learnable_sink", "off_by_one", "window_sink_gqa", "window_2_1_mqa"])
def test_one_rank_matches_dense(single_rank, window, softmax, groups):
    module = _module(_config(groups=groups, window=window, softmax=softmax))
    g = torch.Generator().manual_seed(0)
    if softmax == "learnable":
        with torch.no_grad():
            module.softmax_offset.copy_(torch.randn(4, generator=g))  # init_method's std 0.02 is too close to 0
    q, k, v = _sbhd(16, 2, 4, 8, g=g), _sbhd(16, 2, groups, 8, g=g), _sbhd(16, 2, groups, 8, g=g)
    _check_module(module, q, k, v, _ref_sbhd(8 ** -0.5, window, 16))


def test_packed_thd_windows_per_sequence(single_rank):
    module = _module(_config(window=(3, 0), softmax="learnable"))
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        module.softmax_offset.copy_(torch.randn(4, generator=g))
    cu = torch.tensor([0, 7, 10, 18], dtype=torch.int32)
    params = PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=8, max_seqlen_kv=8)
    q, k, v = _sbhd(18, 4, 8, g=g), _sbhd(18, 2, 8, g=g), _sbhd(18, 2, 8, g=g)

    def ref(q, k, v, sink):
        pieces = []
        for start, end in zip(cu[:-1].tolist(), cu[1:].tolist()):
            t = [x[start:end].transpose(0, 1).unsqueeze(0) for x in (q, k, v)]
            pos = torch.arange(end - start)
            pieces.append(dense(*t, 8 ** -0.5, pos, pos, (3, 0), True, sink)[0].transpose(0, 1).reshape(end - start, -1))
        return torch.cat(pieces)
    _check_module(module, q, k, v, ref, packed=params)


def test_same_as_megatron_local_attention(single_rank):
    """megatron-core's DotProductAttention (its sliding-window mask and SoftmaxOne) on the same config: the sink is
    the same parameter (name, shape, init from the same seed), outputs and gradients agree."""
    from megatron.core.transformer.dot_product_attention import DotProductAttention

    config = _config(groups=4, window=(4, 0), softmax="learnable")
    torch.manual_seed(3)
    ours = _module(config)
    torch.manual_seed(3)
    theirs = DotProductAttention(config, layer_number=1, attn_mask_type=AttnMaskType.causal, attention_type="self")
    assert [n for n, _ in ours.named_parameters()] == [n for n, _ in theirs.named_parameters()] == ["softmax_offset"]
    assert torch.equal(ours.softmax_offset, theirs.softmax_offset)
    with torch.no_grad():
        for m in (ours, theirs):
            m.softmax_offset.copy_(torch.linspace(-1, 1, 4))
    g = torch.Generator().manual_seed(2)
    q, k, v = _sbhd(12, 2, 4, 8, g=g), _sbhd(12, 2, 4, 8, g=g), _sbhd(12, 2, 4, 8, g=g)
    dout = torch.randn(12, 2, 32, generator=g)
    results = []
    for m in (ours, theirs):
        out = m(q, k, v, None)
        results.append([out] + list(torch.autograd.grad(out, [q, k, v, m.softmax_offset], dout)))
    error = _max_diff(*results)
    assert error < ATOL, f"max abs difference to megatron-core's local attention {error:.2e}"


def test_window_layers_follow_skip_freq(single_rank):
    assert [_module(_config(window=(4, 0), skip=3, num_layers=6), n).window for n in range(1, 7)] == \
        [(4, 0), (4, 0), None, (4, 0), (4, 0), None]
    pattern = [1, 0, 0, 1]
    assert [_module(_config(window=(4, 0), skip=pattern, num_layers=4), n).window for n in range(1, 5)] == \
        [(4, 0), None, None, (4, 0)]
    assert _module(_config(window=None, skip=2, num_layers=2), 1).window is None


# ---------------------------------------------------------------- CP2, one spawn

CP_CASES = {  # name: (window, sink?, hq, hk)
    "window_cuts_chunks": ((5, 0), False, 4, 2),
    "sink": (None, True, 4, 2),
    "window_sink_gqa": ((3, 0), True, 4, 1),
    "wide_window_sink": ((20, 0), True, 4, 4),
}


def _local(t, rank, size, dim=2):
    chunks = t.chunk(2 * size, dim=dim)
    return torch.cat([chunks[rank], chunks[2 * size - 1 - rank]], dim=dim)


def _cp_worker(rank, world_size, backend_name):
    from datetime import timedelta

    import torch.distributed as dist

    import mtmegatron
    from mtmegatron.attention.all_gather import all_gather_attention
    from mtmegatron.attention.cp_batch import thd_partition_index
    from mtmegatron.attention.ring import ring_attention
    from mtmegatron.attention.thd_cp import thd_cp_attention

    backend = mtmegatron.activate(backend_name)
    backend.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world_size, timeout=timedelta(seconds=60))
    device = torch.cuda.current_device()
    group = dist.group.WORLD
    errors, sink_grads = {}, {}
    s, d, scale = 16, 8, 8 ** -0.5
    pos = torch.arange(s)
    for name, (window, with_sink, hq, hk) in CP_CASES.items():
        g = torch.Generator().manual_seed(7)
        q, k, v = (torch.randn(2, h, s, d, generator=g).to(device) for h in (hq, hk, hk))
        sink = torch.randn(hq, generator=g).to(device) if with_sink else None
        dout = torch.randn(2, hq, s, d, generator=g).to(device)
        leaves = [t.clone().requires_grad_() for t in (q, k, v)] + ([sink.clone().requires_grad_()] if with_sink else [])
        ref = dense(*leaves[:3], scale, pos, pos, window, True, leaves[3] if with_sink else None)
        want = [ref] + list(torch.autograd.grad(ref, leaves, dout))
        for variant, attend in (("ring", ring_attention), ("all_gather", all_gather_attention)):
            local = [_local(t, rank, world_size).clone().requires_grad_() for t in (q, k, v)]
            own_sink = [sink.clone().requires_grad_()] if with_sink else []
            out = attend(*local, True, scale, group, window, own_sink[0] if with_sink else None)
            grads = torch.autograd.grad(out, local + own_sink, _local(dout, rank, world_size))
            errors[f"{name}/{variant}"] = _max_diff([out, *grads[:3]], [_local(t, rank, world_size) for t in want[:4]])
            if with_sink:
                sink_grads[f"{name}/{variant}"] = (grads[3], want[4])
    # THD under CP: sequences of 8 and 12 (multiples of 2*CP), window + sink, per-sequence positions
    cu = torch.tensor([0, 8, 20])
    g = torch.Generator().manual_seed(8)
    q, k, v = (torch.randn(20, h, d, generator=g) for h in (4, 2, 2))
    sink, dout = torch.randn(4, generator=g), torch.randn(20, 4, d, generator=g)
    leaves = [t.clone().requires_grad_() for t in (q, k, v, sink)]
    pieces = []
    for a, b in ((0, 8), (8, 20)):
        seq = [t[a:b].transpose(0, 1).unsqueeze(0) for t in leaves[:3]]
        pieces.append(dense(*seq, scale, torch.arange(b - a), torch.arange(b - a), (3, 0), True, leaves[3])[0]
                      .transpose(0, 1))
    ref = torch.cat(pieces)
    want = [ref] + list(torch.autograd.grad(ref, leaves, dout))
    index = thd_partition_index(cu, world_size, rank)
    local = [t.index_select(0, index).to(device).requires_grad_() for t in (q, k, v)]
    own_sink = sink.clone().to(device).requires_grad_()
    out = thd_cp_attention(*local, cu.to(device), True, scale, group, (3, 0), own_sink)
    grads = torch.autograd.grad(out, local + [own_sink], dout.index_select(0, index).to(device))
    errors["thd/all_gather"] = _max_diff([out, *grads[:3]], [t.index_select(0, index) for t in want[:4]])
    sink_grads["thd/all_gather"] = (grads[3], want[4])
    return errors, sink_grads


def test_cp2_ring_and_all_gather_match_dense(backend_name):
    per_rank = run_ranks(_cp_worker, 2, backend_name, timeout=180)
    for rank, (errors, _) in enumerate(per_rank):
        for key, error in errors.items():
            assert error < ATOL, f"rank {rank} {key}: max abs difference {error:.2e}"
    print({k: max(r[0][k] for r in per_rank) for k in per_rank[0][0]})
    for key in per_rank[0][1]:  # the sink's gradient: each rank's rows' share, summed (DDP's all-reduce over CP)
        total = sum(torch.as_tensor(r[1][key][0]) for r in per_rank)
        want = torch.as_tensor(per_rank[0][1][key][1])
        assert _max_diff([total], [want]) < ATOL, f"{key}: sink gradient {total} != {want}"


# ---------------------------------------------------------------- pretrain from the command line

def test_tiny_llama3_trains_with_window_and_learnable_sinks(tmp_path):
    from helpers.pretrain_runner import TINY, run_pretrain

    args = TINY + ["--window-size", "4,0", "--window-attn-skip-freq", "2", "--softmax-type", "learnable",
                   "--train-iters", "6", "--global-batch-size", "2"]
    _, rows = run_pretrain(1, args, tmp_path / "run")
    losses = [r["loss"] for r in rows]
    assert len(losses) == 6 and all(torch.isfinite(torch.tensor(losses))), losses
    assert losses[-1] < losses[0], losses
    print("losses", losses)


# ---------------------------------------------------------------- simulated MUSA device

MUSA_SNIPPET = """
import torch
import mtmegatron
from mtmegatron.attention.blocks import block_forward, block_backward
from mtmegatron.attention.window_sink import block_allowed, sdpa_window_sink
mtmegatron.activate("musa")
g = torch.Generator().manual_seed(0)
q, k, v, dout = (torch.randn(1, h, 12, 8, generator=g) for h in (4, 2, 2, 4))
sink = torch.randn(4, generator=g)
def run(dev):
    leaves = [t.to(dev).requires_grad_() for t in (q, k, v, sink)]
    allowed = block_allowed(0, 12, 0, 12, (3, 0), True, dev)
    out = sdpa_window_sink(*leaves[:3], allowed, leaves[3], 8 ** -0.5)
    grads = torch.autograd.grad(out, leaves, dout.to(dev))
    mask = block_allowed(8, 12, 4, 12, (5, 0), True, dev)   # a block a window cuts, on the math kernel
    o, lse = block_forward(q.to(dev), k.to(dev), v.to(dev), False, 8 ** -0.5, mask)
    return [t.cpu() for t in (out, *grads, o, lse)], out.device.type
host, _ = run("cpu")
dev, kind = run("musa")
assert kind == "musa", kind
err = max((a - b).abs().max().item() for a, b in zip(host, dev) if a.isfinite().all())
assert err < 1e-6, err
print("max diff", err)
"""


@pytest.mark.musa_sim
def test_window_sink_on_simulated_musa():
    from helpers.musa_sim import run_python_in_sim

    done = run_python_in_sim(MUSA_SNIPPET)
    assert "max diff" in done.stdout, done.stdout
