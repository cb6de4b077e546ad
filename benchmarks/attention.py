"""Peak memory and time of megatron-core's local ``DotProductAttention``, ``--transformer-impl mtmegatron``'s
fused-softmax attention (``FusedDotProductAttention``: the same ``[b, h, s, s]`` scores, softmax by
mtmegatron's scaled-upper-triangular kernel) and mtmegatron's SDPA core attention.

One forward + backward of core attention (causal, GQA, fp32 by default) at each sequence length, on the CPU.
Every (implementation, length) runs in its own fresh process so its peak resident memory is its own: peak =
max RSS during the call minus RSS just before it (inputs and model state already allocated). Time is the best
of ``--repeats`` calls after one warm-up. Prints one table with the local/ours and fused/ours ratios.

Usage: python benchmarks/attention.py [--seqs 1024 2048 4096 8192] [--heads 4] [--groups 2] [--dim 64]
       [--threads 1] [--dtype float32]
Defaults keep the whole run to a few minutes on 2 cores (local attention at 8k holds several [h, s, s]
fp32 tensors: 1 GiB each at 4 heads, ~4.5 GiB peak). May assume: mtmegatron installed; the cpu backend.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

IMPLS = ("local", "fused", "ours")


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def run_case(impl: str, seq: int, heads: int, groups: int, dim: int, dtype: str, repeats: int, threads: int):
    """In a fresh process: build one core attention module, time fwd+bwd, report peak memory above baseline."""
    import torch

    torch.set_num_threads(threads)
    import mtmegatron
    from megatron.core import parallel_state, tensor_parallel
    from megatron.core.transformer import TransformerConfig
    from megatron.core.transformer.dot_product_attention import DotProductAttention
    from megatron.core.transformer.enums import AttnMaskType

    from mtmegatron.attention.core import SDPADotProductAttention
    from mtmegatron.models.fused_spec import FusedDotProductAttention

    mtmegatron.activate("cpu")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29000 + os.getpid() % 1000))
    torch.distributed.init_process_group("gloo", rank=0, world_size=1)
    parallel_state.initialize_model_parallel()
    tensor_parallel.model_parallel_cuda_manual_seed(1234)  # megatron's local attention forks its RNG state
    config = TransformerConfig(num_layers=1, hidden_size=heads * dim, num_attention_heads=heads,
                               num_query_groups=groups, kv_channels=dim, attention_dropout=0.0,
                               masked_softmax_fusion=False, use_cpu_initialization=True)
    cls = {"local": DotProductAttention, "fused": FusedDotProductAttention, "ours": SDPADotProductAttention}[impl]
    module = cls(config, layer_number=1, attn_mask_type=AttnMaskType.causal, attention_type="self")
    dt = getattr(torch, dtype)
    q = torch.randn(seq, 1, heads, dim, dtype=dt, requires_grad=True)
    k = torch.randn(seq, 1, groups, dim, dtype=dt, requires_grad=True)
    v = torch.randn(seq, 1, groups, dim, dtype=dt, requires_grad=True)
    grad = torch.randn(seq, 1, heads * dim, dtype=dt)

    def step():
        out = module(q, k, v, None)
        out.backward(grad)
        q.grad = k.grad = v.grad = None

    baseline = _rss_mib()
    step()  # warm-up; also the peak (the same work every call)
    peak = _peak_mib() - baseline
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        step()
        best = min(best, time.perf_counter() - t0)
    torch.distributed.destroy_process_group()
    return {"impl": impl, "seq": seq, "peak_mib": peak, "seconds": best}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seqs", type=int, nargs="+", default=[1024, 2048, 4096, 8192])
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--groups", type=int, default=2)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--case", nargs=2, metavar=("IMPL", "SEQ"), help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.case:
        result = run_case(a.case[0], int(a.case[1]), a.heads, a.groups, a.dim, a.dtype, a.repeats, a.threads)
        print(json.dumps(result))
        return
    shape = (f"--heads {a.heads} --groups {a.groups} --dim {a.dim} --dtype {a.dtype} --repeats {a.repeats} "
             f"--threads {a.threads}")
    print(f"core attention fwd+bwd, causal, batch 1, {a.heads} heads / {a.groups} KV groups, head dim {a.dim}, "
          f"{a.dtype}, {a.threads} thread(s); peak = RSS above the pre-call baseline")
    print(f"{'seq':>6} | {'local MiB':>10} {'fused MiB':>9} {'ours MiB':>9} | {'local s':>8} {'fused s':>8} "
          f"{'ours s':>7} | {'local/ours':>10} {'fused/ours':>10}")
    for seq in a.seqs:
        row = {}
        for impl in IMPLS:
            cmd = [sys.executable, __file__, "--case", impl, str(seq)] + shape.split()
            env = {**os.environ, "OMP_NUM_THREADS": str(a.threads), "PYTHONWARNINGS": "ignore"}
            out = subprocess.run(cmd, capture_output=True, text=True, env=env)
            if out.returncode:
                raise SystemExit(f"{impl} at {seq} failed:\n{out.stderr[-3000:]}")
            row[impl] = json.loads(out.stdout.strip().splitlines()[-1])
        lo, fu, us = row["local"], row["fused"], row["ours"]
        print(f"{seq:>6} | {lo['peak_mib']:>10.1f} {fu['peak_mib']:>9.1f} {us['peak_mib']:>9.1f}"
              f" | {lo['seconds']:>8.3f} {fu['seconds']:>8.3f} {us['seconds']:>7.3f}"
              f" | {lo['seconds'] / us['seconds']:>10.2f} {fu['seconds'] / us['seconds']:>10.2f}", flush=True)


if __name__ == "__main__":
    main()
