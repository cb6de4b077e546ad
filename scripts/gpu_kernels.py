"""GPU check of the fused kernels (run where a CUDA or MUSA device is lent; UNVERIFIED so far, no GPU was
available when it was written). Optionally rebuilds the extension with CUDA kernels, then for every op compares
the device result (native kernel) with the Python reference run on CPU on the same random inputs, and times the
device op against its eager composite and TransformerEngine's fused op when importable. Prints a table.

Usage: python scripts/gpu_kernels.py [--build] [--device cuda] [--dtype bfloat16]
May assume: a device of --device's type is present; torch.accelerator exists (torch >= 2.6).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

import torch


def build():
    env = dict(os.environ, MTMEGATRON_BUILD_CUDA="1")
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-build-isolation", "-e", "."], check=True, env=env)


def sync():
    if torch.accelerator.is_available():
        torch.accelerator.synchronize()


def timeit(fn, iters=20):
    fn()
    sync()
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    sync()
    return (time.perf_counter() - start) / iters * 1e3


def cases(dt, dev):
    from mtmegatron.ops import activation, cross_entropy, moe, norm, rope, router, softmax

    g = torch.Generator().manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=g).to(dt)  # noqa: E731
    x, w = r(8 * 1024 + 3, 4096), r(4096)
    fc1 = r(8 * 1024 + 3, 2 * 2731)
    t, f = r(1024, 2, 16, 128), torch.randn(1024, 1, 1, 64, generator=g).repeat(1, 1, 1, 2)
    att, mask = r(2, 16, 1024, 1024), torch.rand(2, 1, 1024, 1024, generator=g) > 0.9
    logits, target = r(4097, 32000), torch.randint(0, 32000, (4097,), generator=g)
    rl, bias = torch.randn(4096, 64, generator=g).to(dt), torch.randn(64, generator=g) * 0.01
    rmap = router.moe_router_topk_reference(rl.float(), bias, 8, 8, 4, 2.5)[1]
    tok = r(4096, 2048)
    yield "rms_norm", norm.rms_norm_op, norm.rms_norm_reference, (x, w, 1e-5), None
    yield "swiglu", activation.swiglu_op, activation.swiglu_reference, (fc1,), None
    yield "rope", rope.rope_op, rope.rope_reference, (t, f, 0, 1.0), "rope"
    yield "scaled_masked_softmax", softmax.scaled_masked_softmax_op, softmax.scaled_masked_softmax_reference, (att, mask, 0.125), None
    yield "causal_softmax", softmax.scaled_upper_triang_masked_softmax_op, softmax.scaled_upper_triang_masked_softmax_reference, (att.view(-1, 1024, 1024), 0.125), None
    yield "cross_entropy", cross_entropy.cross_entropy_op, cross_entropy.cross_entropy_reference, (logits, target, -100), None
    yield "moe_router_topk", router.moe_router_topk_op, router.moe_router_topk_reference, (rl, bias, 8, 8, 4, 2.5), None
    yield "moe_permute_index", moe.moe_permute_index_op, moe.moe_permute_index_reference, (rmap,), None
    idx, rid = moe.moe_permute_index_reference(rmap)
    yield "moe_permute", moe.moe_permute_op, moe.moe_permute_reference, (tok, idx, rid), None
    perm = r(idx.numel(), 2048)
    yield "moe_unpermute", moe.moe_unpermute_op, moe.moe_unpermute_reference, (perm, rid, torch.rand(4096, 64, generator=g)), None


def to(dev, a):
    return a.to(dev) if isinstance(a, torch.Tensor) else a


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--build", action="store_true")
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="bfloat16")
    args = p.parse_args()
    if args.build:
        build()
    from mtmegatron import ops

    dt = getattr(torch, args.dtype)
    print(f"device={args.device} native={ops.native_available(args.device)} build={ops.BUILD_INFO}")
    print("| op | max abs err vs CPU reference | ours ms | eager ms | eager/ours |")
    print("|---|---|---|---|---|")
    for name, op, ref, cpu_args, _ in cases(dt, args.device):
        dev_args = tuple(to(args.device, a) for a in cpu_args)
        out, expected = op(*dev_args), ref(*cpu_args)
        out = out if isinstance(out, tuple) else (out,)
        expected = expected if isinstance(expected, tuple) else (expected,)
        err = max((o.cpu().double() - e.double()).abs().max().item() for o, e in zip(out, expected) if o.numel())
        t_ours, t_eager = timeit(lambda: op(*dev_args)), timeit(lambda: ref(*dev_args))
        print(f"| {name} | {err:.3g} | {t_ours:.3f} | {t_eager:.3f} | {t_eager / t_ours:.2f}x |")
    try:
        import transformer_engine.pytorch as te  # noqa: F401

        print("TransformerEngine importable: compare with te.RMSNorm / fused rope manually (not automated yet)")
    except ImportError:
        print("TransformerEngine not importable: no TE column")


if __name__ == "__main__":
    main()
