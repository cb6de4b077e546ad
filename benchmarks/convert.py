"""Throughput and peak memory of the streaming converter, both directions (convert/streaming.py: ``hf-to-mcore``,
convert/streaming_export.py: ``mcore-to-hf``).

For each size: a synthetic Llama-shaped bf16 HF checkpoint (convert/synthetic.py: random data, one shard per
layer) is written, then for each direction
* the bound: the same bytes read from the source files and written to one new file, plainly (one process, 64 MiB
  blocks), measured in the same run on the same disk: without fsync (the converters do not fsync either: "bound",
  the % column) and with an fsync at the end ("bound+fsync", the disk);
* the conversion with 1 and with 2 workers (the CLI in a subprocess), timed end to end (process start and
  imports, flags and meta model, the workers, the merge);
* where the time goes: ``import`` = process start + imports (wall time before the converter starts), ``setup`` =
  flags, meta model, checks and the output layout (``setup_seconds`` in the finished marker), the rest is the
  workers reading, transforming and writing;
* ``% bound`` counts the whole wall time (process start and ~6 s of torch + megatron-core imports, which dominate
  the small sizes); ``workers % bound`` the workers' time alone (what the issue's >= 50% with 2 workers is about);
* peak RSS of every process from /proc: each worker's and the converter's VmHWM (``conversion_complete.json``).
mcore-to-hf reads the checkpoint hf-to-mcore wrote with 2 workers. Prints one table. The files sit in the page
cache for both the bound and the conversions (written just before), so both measure the same path.

Usage: nice -n 19 python benchmarks/convert.py [--sizes-gb 0.5 1 2] [--hidden 2048] [--dir /tmp/...] [--workers 1 2]
May assume: mtmegatron installed; free disk for about 4x the largest size.
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


def plain_read_write(src: str, dst: str, suffix: str, fsync: bool) -> tuple[int, float]:
    """Bytes of every ``*suffix`` file under ``src`` (recursively) copied into one file ``dst`` by plain
    read/write (``fsync``: and flushed to the disk); seconds."""
    files = sorted(os.path.join(d, f) for d, _, names in os.walk(src) for f in names if f.endswith(suffix))
    total, start = 0, time.perf_counter()
    with open(dst, "wb") as out:
        for path in files:
            with open(path, "rb") as f:
                while block := f.read(64 * 2**20):
                    out.write(block)
                    total += len(block)
        out.flush()
        if fsync:
            os.fsync(out.fileno())
    return total, time.perf_counter() - start


def run_converter(argv: list[str], out: str) -> dict:
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "mtmegatron.cli", "convert", *argv, "--out", out],
                          capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    if proc.returncode != 0:
        raise SystemExit(f"conversion failed:\n{proc.stderr[-3000:]}")
    with open(os.path.join(out, "conversion_complete.json")) as f:
        stats = json.load(f)
    stats["wall_seconds"] = time.perf_counter() - start
    return stats


def bound(src: str, scratch: str, suffix: str) -> tuple[float, float]:
    """(GB/s into the page cache, as the converters write: no fsync; GB/s with an fsync at the end)."""
    rates = []
    for fsync in (False, True):
        copied, seconds = plain_read_write(src, os.path.join(scratch, "copy.bin"), suffix, fsync)
        os.remove(os.path.join(scratch, "copy.bin"))
        rates.append(copied / seconds / 1e9)
    return rates[0], rates[1]


def row(direction: str, nbytes: int, layers: int, workers: int, stats: dict, bounds: tuple[float, float]) -> tuple:
    rate = stats["bytes"] / stats["wall_seconds"] / 1e9
    work = stats["seconds"] - stats["setup_seconds"]
    return (direction, nbytes / 1e9, layers, workers, stats["wall_seconds"], stats["wall_seconds"] - stats["seconds"],
            stats["setup_seconds"], work, rate, stats["bytes"] / work / 1e9, bounds[0], 100 * rate / bounds[0],
            100 * stats["bytes"] / work / 1e9 / bounds[0], bounds[1],
            max(stats["worker_vm_hwm_bytes"]) / 2**20, stats["parent_vm_hwm_bytes"] / 2**20,
            stats["largest_tensor_bytes"] / 2**20)


HEADER = ("direction", "GB", "layers", "workers", "wall s", "import s", "setup s", "workers s", "GB/s",
          "workers GB/s", "bound GB/s", "% bound", "workers % bound", "bound+fsync GB/s", "worker peak MiB", "converter peak MiB",
          "largest MiB")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes-gb", type=float, nargs="+", default=[0.5, 1, 2])
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
            nbytes, layers = write_llama(hf, config), config["num_hidden_layers"]
            rate = bound(hf, scratch, ".safetensors")
            for workers in sorted(a.workers):
                out = os.path.join(scratch, f"mcore-{size}-{workers}")
                stats = run_converter(["hf-to-mcore", "--model", "llama3", "--hf-dir", hf, "--workers", str(workers)],
                                      out)
                rows.append(row("hf-to-mcore", nbytes, layers, workers, stats, rate))
                print("  " + " ".join(str(round(v, 3)) if isinstance(v, float) else str(v) for v in rows[-1]),
                      file=sys.stderr, flush=True)
                if workers != max(a.workers):
                    shutil.rmtree(out)
            shutil.rmtree(hf)
            mcore = os.path.join(scratch, f"mcore-{size}-{max(a.workers)}")
            rate = bound(mcore, scratch, ".distcp")
            for workers in sorted(a.workers):
                out = os.path.join(scratch, f"hf-back-{size}-{workers}")
                stats = run_converter(["mcore-to-hf", "--load", mcore, "--workers", str(workers)], out)
                rows.append(row("mcore-to-hf", nbytes, layers, workers, stats, rate))
                print("  " + " ".join(str(round(v, 3)) if isinstance(v, float) else str(v) for v in rows[-1]),
                      file=sys.stderr, flush=True)
                shutil.rmtree(out)
            shutil.rmtree(mcore)
    finally:
        if a.dir is None:
            shutil.rmtree(scratch, ignore_errors=True)
    print("| " + " | ".join(HEADER) + " |")
    print("|" + "---|" * len(HEADER))
    for r in rows:
        print(f"| {r[0]} | {r[1]:.2f} | {r[2]} | {r[3]} | {r[4]:.1f} | {r[5]:.1f} | {r[6]:.1f} | {r[7]:.1f} | "
              f"{r[8]:.3f} | {r[9]:.3f} | {r[10]:.3f} | {r[11]:.0f} | {r[12]:.0f} | {r[13]:.3f} | {r[14]:.0f} | "
              f"{r[15]:.0f} | {r[16]:.0f} |")


if __name__ == "__main__":
    main()
