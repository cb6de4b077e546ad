"""The FP8 issue-note table on the current machine: per recipe, the final loss of a tiny Llama-3 run vs bf16
(mean of the last 10 iterations), the median step time vs bf16, and the relative error of the FP8 linear's
forward, dgrad and wgrad GEMMs vs fp32 on random data.

Usage: python benchmarks/fp8.py [--iters 200] [--nproc 1] [--tp 1] [--executor auto] [--backend cpu]
Runs ``mtmegatron.pretrain`` through torchrun like a user (the tiny config of tests/helpers/pretrain_runner.py,
2 layers, lr 3e-4, global batch 4). Step times on a shared 2-core box are indicative only.
May assume: mtmegatron installed; run from the repository root.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

RECIPES = ("delayed", "tensorwise", "blockwise", "mxfp8")
TINY = ["--model", "llama3", "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
        "--num-query-groups", "2", "--ffn-hidden-size", "128", "--seq-length", "32", "--max-position-embeddings", "32",
        "--vocab-size", "256", "--micro-batch-size", "2", "--global-batch-size", "4", "--lr", "3e-4",
        "--lr-decay-style", "constant", "--mock-data", "--log-interval", "1000", "--bf16"]


def train(opts, extra, log_dir):
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={opts.nproc}", "-m",
           "mtmegatron.pretrain", "--backend", opts.backend, *TINY, "--train-iters", str(opts.iters),
           "--tensor-model-parallel-size", str(opts.tp), *(["--sequence-parallel"] if opts.tp > 1 else []),
           *extra, "--log-dir", str(log_dir)]
    subprocess.run(cmd, check=True, capture_output=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    rows = [json.loads(line) for line in (log_dir / "metrics.jsonl").read_text().splitlines()]
    final = statistics.mean(r["loss"] for r in rows[-10:])
    step = statistics.median(r["step_time_ms"] for r in rows[len(rows) // 10:])
    return final, step


def gemm_errors(recipe_name, executor):
    from mtmegatron.fp8.linear import Fp8Runtime, _Fp8Linear
    from mtmegatron.fp8.recipes import _BY_NAME

    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(96, 200, generator=g), torch.randn(72, 200, generator=g) * 0.05
    dy = torch.randn(96, 72, generator=g)
    fp8 = Fp8Runtime(_BY_NAME[recipe_name](fp8_format="hybrid"), executor, None, "cpu")
    for _ in range(2):  # the second call: delayed scaling has a history by then
        xg, wg = x.clone().requires_grad_(), w.clone().requires_grad_()
        y = _Fp8Linear.apply(xg, wg, None, fp8, False, False, None)
        y.backward(dy)
    ref = (x @ w.t(), dy @ w, dy.t() @ x)
    return [((a - b).norm() / b.norm()).item() for a, b in zip((y.detach(), xg.grad, wg.grad), ref)]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--iters", type=int, default=200)
    p.add_argument("--nproc", type=int, default=1)
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--backend", default="cpu")
    p.add_argument("--executor", default="auto")
    opts = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base_loss, base_step = train(opts, [], Path(tmp) / "bf16")
        print("| recipe | final loss | vs bf16 | step ms | vs bf16 | GEMM rel err fwd / dgrad / wgrad |")
        print("|---|---|---|---|---|---|")
        print(f"| bf16 | {base_loss:.4f} | | {base_step:.1f} | | |")
        for recipe in RECIPES:
            loss, step = train(opts, ["--fp8-format", "hybrid", "--fp8-recipe", recipe, "--fp8-executor",
                                      opts.executor], Path(tmp) / recipe)
            ex = "scaled_mm" if opts.executor == "auto" else opts.executor
            errs = " / ".join(f"{e:.4f}" for e in gemm_errors(recipe, ex))
            print(f"| {recipe} | {loss:.4f} | {(loss - base_loss) / base_loss:+.2%} | {step:.1f} | "
                  f"{step / base_step:.2f}x | {errs} |", flush=True)


if __name__ == "__main__":
    main()
