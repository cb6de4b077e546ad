"""Benchmark of mtmegatron's fused ops on the current machine's CPU (or `--device`), one table per op:
ours vs the eager composite PyTorch formulation vs PyTorch's own fused op where one exists, with achieved GB/s
against the copy bandwidth measured in the same run (memory-bound ops should reach >= 50% of it).

Usage: python benchmarks/kernels.py [--quick] [--device cpu] [--dtype bfloat16]
Shapes (full): 8x4096 tokens x 4096 hidden; softmax 4x8 heads x 1024^2; loss 8192 tokens x 32k vocab; MoE 4096
tokens x 4096 hidden, 64 experts top-8 (scaled down from 32k tokens to keep the 8x permuted copy in memory);
--quick divides token counts by 8. May assume: mtmegatron is installed with its native library.
"""
from __future__ import annotations

import argparse
import ctypes
import time

import torch
import torch.nn.functional as F

from mtmegatron import ops
from mtmegatron.ops import activation, cross_entropy, moe, norm, rope, router, softmax


def bench(fn, min_time=0.3, max_iters=50):
    """Best (minimum) time of one call over up to max_iters calls / min_time seconds, after a warm-up call: the
    dev VMs are shared, and the minimum is the least disturbed measurement of the same work (like timeit)."""
    fn()  # warm-up
    sync = getattr(torch.accelerator, "synchronize", lambda: None) if DEVICE != "cpu" else (lambda: None)
    sync()
    best, iters, start = float("inf"), 0, time.perf_counter()
    while True:
        t0 = time.perf_counter()
        fn()
        sync()
        best = min(best, time.perf_counter() - t0)
        iters += 1
        if time.perf_counter() - start >= min_time and iters >= 3 or iters >= max_iters:
            return best


def copy_bandwidth(nbytes):
    """(read+write GB/s of copy_ into a preallocated buffer, of clone() which allocates its output)."""
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=DEVICE).uniform_()
    dst = torch.empty_like(src)
    return 2 * nbytes / bench(lambda: dst.copy_(src)) / 1e9, 2 * nbytes / bench(lambda: src.clone()) / 1e9


def keep_large_allocations_in_heap():
    """glibc serves blocks >= 32 MiB with mmap and unmaps them on free, so every large output of every op (ours
    and PyTorch's alike) pays fresh page faults on each call, which costs more than the op itself at these
    shapes. Raising the mmap and trim thresholds (what jemalloc/tcmalloc, the allocators PyTorch recommends for
    CPU, do by design) keeps freed blocks for reuse. Returns whether it applied."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
    return bool(libc.mallopt(M_MMAP_THRESHOLD, 1 << 30)) and bool(libc.mallopt(M_TRIM_THRESHOLD, 1 << 31))


def table(title, nbytes, ours, eager, torch_fused=None, torch_name="-"):
    t_ours, t_eager = bench(ours), bench(eager)
    t_torch = bench(torch_fused) if torch_fused else None
    gbs = nbytes / t_ours / 1e9
    print(f"\n## {title}")
    print("| impl | ms | vs ours | GB/s |")
    print("|---|---|---|---|")
    print(f"| mtmegatron | {t_ours * 1e3:.2f} | 1.00x | {gbs:.1f} ({100 * gbs / COPY_GBS:.0f}% of copy) |")
    print(f"| eager composite | {t_eager * 1e3:.2f} | ours {t_eager / t_ours:.2f}x faster | {nbytes / t_eager / 1e9:.1f} |")
    if t_torch is not None:
        print(f"| {torch_name} | {t_torch * 1e3:.2f} | ours {t_torch / t_ours:.2f}x faster | {nbytes / t_torch / 1e9:.1f} |")
    RESULTS.append((title, t_eager / t_ours, None if t_torch is None else t_torch / t_ours, 100 * gbs / COPY_GBS))


def main():
    global DEVICE, COPY_GBS
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--system-malloc", action="store_true",
                        help="leave glibc's mmap threshold alone (every large output then page-faults)")
    args = parser.parse_args()
    heap = False if args.system_malloc else keep_large_allocations_in_heap()
    DEVICE = args.device
    dt = getattr(torch, args.dtype)
    es = torch.tensor([], dtype=dt).element_size()
    div = 8 if args.quick else 1
    tokens, hidden = 8 * 4096 // div, 4096
    print(f"device={DEVICE} dtype={args.dtype} threads={torch.get_num_threads()} native={ops.native_available(DEVICE)}"
          f" build={ops.BUILD_INFO}")
    COPY_GBS, clone_gbs = copy_bandwidth(256 * 2**20 // div)
    print(f"large blocks kept in the heap (mallopt): {heap}")
    print(f"copy bandwidth (read+write, {256 // div} MiB): copy_ {COPY_GBS:.1f} GB/s, clone {clone_gbs:.1f} GB/s;"
          " '% of copy' below is against copy_")
    g = torch.Generator(device=DEVICE).manual_seed(0)
    rnd = lambda *s, dtype=dt: torch.randn(*s, generator=g, device=DEVICE).to(dtype)  # noqa: E731

    x, w, r = rnd(tokens, hidden), rnd(hidden), rnd(tokens, hidden)
    table(f"rms_norm [{tokens}, {hidden}]", 2 * x.numel() * es, lambda: norm.rms_norm_op(x, w, 1e-5),
          lambda: norm.rms_norm_reference(x, w, 1e-5), lambda: F.rms_norm(x, (hidden,), w, 1e-5), "F.rms_norm")
    table(f"add_rms_norm [{tokens}, {hidden}]", 4 * x.numel() * es, lambda: norm.add_rms_norm_op(x, r, w, 1e-5),
          lambda: norm.add_rms_norm_reference(x, r, w, 1e-5), lambda: F.rms_norm(x + r, (hidden,), w, 1e-5),
          "x + r; F.rms_norm")
    gy = rnd(tokens, hidden)
    _, rstd = norm.rms_norm_op(x, w, 1e-5)
    table(f"rms_norm_backward [{tokens}, {hidden}]", 3 * x.numel() * es,
          lambda: norm.rms_norm_backward_op(gy, x, w, rstd, None),
          lambda: norm.rms_norm_backward_reference(gy, x, w, rstd, None))

    fc1 = rnd(tokens, 2 * 2048)
    table(f"swiglu [{tokens}, 2x2048]", fc1.numel() * es * 3 // 2, lambda: activation.swiglu_op(fc1),
          lambda: F.silu(fc1.chunk(2, -1)[0]) * fc1.chunk(2, -1)[1])
    gs = rnd(tokens, 2048)
    table(f"swiglu_backward [{tokens}, 2x2048]", fc1.numel() * es * 5 // 2,
          lambda: activation.swiglu_backward_op(gs, fc1), lambda: activation.swiglu_backward_reference(gs, fc1))

    s, b, h, d = 4096 // div, 2, 32, 128
    t = rnd(s, b, h, d)
    base = torch.randn(s, 1, 1, d // 2, generator=g, device=DEVICE)
    freqs = torch.cat([base, base], -1)
    from megatron.core.models.common.embeddings.rope_utils import _apply_rotary_pos_emb_bshd
    table(f"rope [{s}, {b}, {h}, {d}]", 2 * t.numel() * es, lambda: rope.rope_op(t, freqs, 0, 1.0),
          lambda: _apply_rotary_pos_emb_bshd(t, freqs))

    att = rnd(4 // min(div, 4), 8, 1024, 1024)
    mask = torch.rand(att.shape[0], 1, 1024, 1024, generator=g, device=DEVICE) > 0.9
    table(f"scaled_masked_softmax {list(att.shape)}", 2 * att.numel() * es,
          lambda: softmax.scaled_masked_softmax_op(att, mask, 0.125),
          lambda: torch.softmax((att.float() * 0.125).masked_fill(mask, -10000.0), -1).to(dt),
          lambda: torch.softmax(att * 0.125 + torch.where(mask, -10000.0, 0.0).to(dt), -1), "torch.softmax(+bias)")
    att3 = att.view(-1, 1024, 1024)
    table(f"scaled_upper_triang_masked_softmax {list(att3.shape)}", 2 * att3.numel() * es,
          lambda: softmax.scaled_upper_triang_masked_softmax_op(att3, 0.125),
          lambda: softmax.scaled_upper_triang_masked_softmax_reference(att3, 0.125))

    rows, vocab = 8192 // div, 32000
    logits = rnd(rows, vocab)
    target = torch.randint(0, vocab, (rows,), generator=g, device=DEVICE)
    table(f"cross_entropy fwd [{rows}, {vocab}]", logits.numel() * es,
          lambda: cross_entropy.cross_entropy_op(logits, target, -100),
          lambda: cross_entropy.cross_entropy_reference(logits, target, -100),
          lambda: F.cross_entropy(logits.float(), target, reduction="none"), "F.cross_entropy(fp32)")
    _, lse = cross_entropy.cross_entropy_op(logits, target, -100)
    gl = torch.ones(rows, device=DEVICE)
    table(f"cross_entropy backward [{rows}, {vocab}]", 2 * logits.numel() * es,
          lambda: cross_entropy.cross_entropy_backward_op(gl, logits, target, lse, 0, -100),
          lambda: cross_entropy.cross_entropy_backward_reference(gl, logits, target, lse, 0, -100))

    from megatron.core.transformer.moe import moe_utils
    mt, experts, topk = 4096 // div, 64, 8
    tok = rnd(mt, hidden)
    rlogits = torch.randn(mt, experts, generator=g, device=DEVICE)
    bias = torch.randn(experts, generator=g, device=DEVICE) * 0.01
    table(f"moe_router_topk [{mt}, {experts}] top{topk} 8 groups/4", rlogits.numel() * 8,
          lambda: router.moe_router_topk_op(rlogits, bias, topk, 8, 4, 2.5),
          lambda: moe_utils.topk_routing_with_score_function(rlogits, topk, num_groups=8, group_topk=4,
                                                             scaling_factor=2.5, score_function="sigmoid",
                                                             expert_bias=bias))
    probs, rmap = router.moe_router_topk_op(rlogits, bias, topk, 8, 4, 2.5)
    table(f"permute [{mt}, {hidden}] {experts} experts top{topk}", 2 * topk * tok.numel() * es,
          lambda: moe.permute(tok, rmap), lambda: moe_utils.permute(tok, rmap))
    permuted, _, idx = moe.permute(tok, rmap)
    table(f"unpermute (with probs) [{mt * topk}, {hidden}]", (1 + topk) * tok.numel() * es,
          lambda: moe.unpermute(permuted, idx, tok.shape, probs=probs.float(), routing_map=rmap),
          lambda: moe_utils.unpermute(permuted, idx, tok.shape, probs=probs.float(), routing_map=rmap))

    numels = [4096 * 4096 // div, 4096 * 11008 // div, 4096, 1000003]
    params = [torch.randn(n, generator=g, device=DEVICE) for n in numels]
    grads = [torch.randn(n, generator=g, device=DEVICE) for n in numels]
    m = [torch.zeros(n, device=DEVICE) for n in numels]
    v = [torch.zeros(n, device=DEVICE) for n in numels]
    total = sum(numels) * 4 * 7  # read p, g, m, v; write p, m, v
    kw = dict(lr=1e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, step=10)
    steps = [torch.tensor(10.0) for _ in numels]
    table(f"adam_step {len(numels)} tensors, {sum(numels) / 1e6:.0f}M params", total,
          lambda: ops.adam_step(params, grads, m, v, **kw),
          lambda: torch.optim._functional.adamw(params, grads, m, v, [], steps, foreach=False, capturable=False,
                                                differentiable=False, fused=None, grad_scale=None, found_inf=None,
                                                has_complex=False, amsgrad=False, beta1=0.9, beta2=0.95, lr=1e-4,
                                                weight_decay=0.1, eps=1e-8, maximize=False),
          lambda: torch.optim._functional.adamw(params, grads, m, v, [], steps, foreach=False, capturable=False,
                                                differentiable=False, fused=True, grad_scale=None, found_inf=None,
                                                has_complex=False, amsgrad=False, beta1=0.9, beta2=0.95, lr=1e-4,
                                                weight_decay=0.1, eps=1e-8, maximize=False),
          "AdamW(fused=True)")

    print("\n## summary (speed-up of ours; >1 = ours faster)")
    print("| op | vs eager | vs torch fused | % of copy BW |")
    print("|---|---|---|---|")
    for title, eager, fused, pct in RESULTS:
        print(f"| {title} | {eager:.2f}x | {'-' if fused is None else f'{fused:.2f}x'} | {pct:.0f}% |")


DEVICE, COPY_GBS, RESULTS = "cpu", 1.0, []

if __name__ == "__main__":
    main()
