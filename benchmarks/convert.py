"""Throughput and peak memory of the streaming ``mtmegatron convert hf-to-mcore`` (convert/streaming.py).

For each size: a synthetic Llama-shaped bf16 HF checkpoint (convert/synthetic.py: random data, one shard per
layer) is written, then
* the bound: the same bytes read from the HF files and written to one new file, plainly (one process, 64 MiB
  blocks, fsync at the end), measured in the same run on the same disk;
* the conversion with 1 and with 2 workers (the CLI in a subprocess), timed end to end (process start, meta
  model, worker spawn and the merge included);
* peak RSS of every process from /proc: each worker's and the converter's VmHWM (``conversion_complete.json``).
Prints one table: GB/s, % of the bound, peak RSS per worker and of the converter. The files sit in the page
cache for both the bound and the conversions (written just before), so both measure the same path.

Usage: python benchmarks/convert.py [--sizes-gb 0.5 1 2 4] [--hidden 2048] [--dir /tmp/...] [--workers 1 2]
May assume: mtmegatron installed; enough free disk for 3x the largest size.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time


def plain_read_write(src: str, dst: str) -> tuple[int, float]:
    """Bytes of every *.safetensors under ``src`` copied into one file ``dst`` by plain read/write; seconds."""
    files = sorted(os.path.join(src, f) for f in os.listdir(src) if f.endswith(".safetensors"))
    total, start = 0, time.perf_counter()
    with open(dst, "wb") as out:
        for path in files:
            with open(path, "rb") as f:
                while block := f.read(64 * 2**20):
                    out.write(block)
                    total += len(block)
        out.flush()
        os.fsync(out.fileno())
    return total, time.perf_counter() - start


def convert(hf_dir: str, out: str, workers: int) -> dict:
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "mtmegatron.cli", "convert", "hf-to-mcore", "--model", "llama3",
                           "--hf-dir", hf_dir, "--out", out, "--workers", str(workers)],
                          capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    if proc.returncode != 0:
        raise SystemExit(f"conversion failed:\n{proc.stderr[-3000:]}")
    with open(os.path.join(out, "conversion_complete.json")) as f:
        stats = json.load(f)
    stats["wall_seconds"] = time.perf_counter() - start
    return stats


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes-gb", type=float, nargs="+", default=[0.5, 1, 2, 4])
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    p.add_argument("--dir", default=None, help="scratch directory (default: a new one under $TMPDIR)")
    a = p.parse_args()
    from mtmegatron.convert.synthetic import llama_shape_for, write_llama

    scratch = a.dir or tempfile.mkdtemp(prefix="mtmegatron-convert-bench-")
    rows = []
    try:
        for size in a.sizes_gb:
            hf = os.path.join(scratch, f"hf-{size}")
            config = llama_shape_for(int(size * 1e9), hidden=a.hidden)
            nbytes = write_llama(hf, config)
            copied, seconds = plain_read_write(hf, os.path.join(scratch, "copy.bin"))
            os.remove(os.path.join(scratch, "copy.bin"))
            bound = copied / seconds / 1e9
            for workers in a.workers:
                out = os.path.join(scratch, f"mcore-{size}-{workers}")
                stats = convert(hf, out, workers)
                rate = stats["bytes"] / stats["wall_seconds"] / 1e9
                rows.append((nbytes / 1e9, config["num_hidden_layers"], workers, stats["wall_seconds"], rate, bound,
                             100 * rate / bound, max(stats["worker_vm_hwm_bytes"]) / 2**20,
                             stats["parent_vm_hwm_bytes"] / 2**20, stats["largest_tensor_bytes"] / 2**20))
                shutil.rmtree(out)
                print(f"  {size} GB, {workers} worker(s): {rate:.3f} GB/s", file=sys.stderr, flush=True)
            shutil.rmtree(hf)
    finally:
        if a.dir is None:
            shutil.rmtree(scratch, ignore_errors=True)
    print(f"{'GB':>6} {'layers':>6} {'workers':>7} {'seconds':>8} {'GB/s':>7} {'bound GB/s':>10} {'% bound':>7} "
          f"{'worker peak MiB':>15} {'converter peak MiB':>18} {'largest tensor MiB':>18}")
    for r in rows:
        print(f"{r[0]:6.2f} {r[1]:6d} {r[2]:7d} {r[3]:8.1f} {r[4]:7.3f} {r[5]:10.3f} {r[6]:7.0f} {r[7]:15.0f} "
              f"{r[8]:18.0f} {r[9]:18.0f}")


if __name__ == "__main__":
    main()
