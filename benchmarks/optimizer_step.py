"""Step time of a CPU pretrain run with megatron-core's torch AdamW (old) vs mtmegatron's FusedAdam (new).

One script run trains a ~44M-parameter llama3 (8 layers, hidden 512) for a few iterations per variant on the cpu
backend, one process, and prints the median step time (iterations after the first two) and the ratio new/old per
precision. "old" is the same command with ``MTMEGATRON_DISABLE_PATCHES=optimizer_fused_adam``, which leaves
megatron's own torch AdamW in place. Runs alternate old/new ``--repeats`` times so load from other processes hits
both alike.
Usage: python benchmarks/optimizer_step.py [--iters 8] [--repeats 2] [--threads 1]
May assume: mtmegatron installed (or the repo on sys.path); a CPU; no launcher variables needed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

MODEL = ["--backend", "cpu", "--model", "llama3", "--num-layers", "8", "--hidden-size", "512",
         "--num-attention-heads", "8", "--num-query-groups", "4", "--ffn-hidden-size", "1408",
         "--vocab-size", "16384", "--seq-length", "128", "--max-position-embeddings", "128",
         "--micro-batch-size", "2", "--global-batch-size", "2", "--lr", "1e-4", "--lr-decay-style", "constant",
         "--mock-data", "--log-interval", "1000"]
VARIANTS = {"fp32": [], "bf16": ["--bf16"], "bf16 distopt": ["--bf16", "--use-distributed-optimizer"]}


def step_times(extra: list[str], old: bool, iters: int, threads: int) -> list[float]:
    with tempfile.TemporaryDirectory() as log_dir:
        env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
        env["OMP_NUM_THREADS"] = str(threads)
        if old:
            env["MTMEGATRON_DISABLE_PATCHES"] = "optimizer_fused_adam"
        cmd = [sys.executable, "-m", "mtmegatron.pretrain", *MODEL, *extra, "--train-iters", str(iters),
               "--log-dir", log_dir]
        done = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if done.returncode != 0:
            raise SystemExit(f"pretrain failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
        optimizer = [l for l in done.stdout.splitlines() if "mtmegatron: optimizer:" in l]
        expected = "torch.AdamW" if old else "mtmegatron.FusedAdam"
        assert optimizer and expected in optimizer[0], (expected, optimizer)
        with open(os.path.join(log_dir, "metrics.jsonl")) as f:
            rows = [json.loads(line) for line in f]
    return [r["step_time_ms"] for r in rows[2:]]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--iters", type=int, default=8)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args()
    print(f"llama3 8 layers x 512 hidden, vocab 16384 (~44M params), cpu backend, 1 process, "
          f"OMP_NUM_THREADS={a.threads}, {a.iters} iterations x {a.repeats} repeats per variant")
    print(f"{'variant':<14} {'old ms (torch AdamW)':>21} {'new ms (FusedAdam)':>19} {'new/old':>8}")
    for name, extra in VARIANTS.items():
        old, new = [], []
        for _ in range(a.repeats):
            old += step_times(extra, True, a.iters, a.threads)
            new += step_times(extra, False, a.iters, a.threads)
        o, n = statistics.median(old), statistics.median(new)
        print(f"{name:<14} {o:>21.1f} {n:>19.1f} {n / o:>8.3f}", flush=True)


if __name__ == "__main__":
    main()
