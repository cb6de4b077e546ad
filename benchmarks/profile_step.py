"""Where a training step's time goes: torch.profiler over two steps of benchmarks/step.py's dense row
(``--transformer-impl mtmegatron``, fusions on, its representative shape: the 8B-shaped layers, 8 micro-batches and
the distributed optimizer on a GPU; the tiny model on the cpu), through mtmegatron's own ``--profile
--use-pytorch-profiler`` (training/observability/profiler.py: record_shapes and Python stacks on).

From the chrome trace it reports: the top 20 kernels by time with their share of all kernel time (GPU: device
kernels, memcpy and memset; cpu: the self time of each aten op), and a phase breakdown of the profiled steps'
wall time: forward, backward, optimizer, communication, idle. A kernel's phase is that of the moment its launch
(GPU: the runtime call with its correlation id; cpu: the op itself) falls in: inside megatron-core's
``schedules.py`` ``forward_step`` / ``backward_step`` or an autograd ``evaluate_function`` (backward), inside
megatron-core's optimizer ``step`` (optimizer); kernels named like a collective (nccl, gloo, all_reduce,
reduce_scatter, all_gather, broadcast) are communication wherever they start; the rest is "other" (loss, data,
logging). Idle: the steps' wall time that no kernel covers (GPU: the device waiting on the host; cpu: time outside
any op). Writes ``profile.json``, ``profile.md`` and the trace, gzipped, as ``profile_trace.json.gz`` into
``--out``.
Usage: python benchmarks/profile_step.py [--backend cpu|cuda|musa] [--cpu-size tiny|small] [--out DIR]
       [--warmup 2] [--threads N] [--num-layers auto|N]
Exit status 1 when the run or its trace failed.
May assume: mtmegatron installed; torch >= 2.6.
"""

from __future__ import annotations

import argparse
import bisect
import collections
import gzip
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import step  # noqa: E402

DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
COMM = re.compile(r"nccl|gloo|all_?reduce|reduce_?scatter|all_?gather|broadcast|all_to_all|alltoall|c10d::",
                  re.IGNORECASE)
FORWARD = re.compile(r"schedules\.py\(\d+\): forward_step$")
BACKWARD = re.compile(r"schedules\.py\(\d+\): backward_step$|^autograd::engine::evaluate_function")
OPTIMIZER = re.compile(r"megatron/core/optimizer/\S*\.py\(\d+\): step$|^Optimizer\.(step|zero_grad)")
PHASES = ("forward", "backward", "optimizer", "communication", "other", "idle")


class Windows:
    """Sorted, merged [start, end) intervals; ``holds(t)`` in O(log n)."""

    def __init__(self, spans):
        merged = []
        for s, e in sorted(spans):
            if merged and s <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], e)
            else:
                merged.append([s, e])
        self.starts = [s for s, _ in merged]
        self.spans = merged

    def holds(self, t: float) -> bool:
        i = bisect.bisect_right(self.starts, t) - 1
        return i >= 0 and t < self.spans[i][1]

    def total(self) -> float:
        return sum(e - s for s, e in self.spans)


def _self_times(ops: list[dict]) -> list[tuple[dict, float]]:
    """(op, self time) for cpu ops: each op's duration less its directly nested ops' on the same thread."""
    out = []
    by_tid = collections.defaultdict(list)
    for e in ops:
        by_tid[(e.get("pid"), e.get("tid"))].append(e)
    for events in by_tid.values():
        events.sort(key=lambda e: (e["ts"], -e["dur"]))
        stack: list[list] = []  # [event, children time]
        for e in events:
            while stack and e["ts"] >= stack[-1][0]["ts"] + stack[-1][0]["dur"]:
                done = stack.pop()
                out.append((done[0], max(0.0, done[0]["dur"] - done[1])))
            if stack:
                stack[-1][1] += e["dur"]
            stack.append([e, 0.0])
        out += [(d[0], max(0.0, d[0]["dur"] - d[1])) for d in stack]
    return out


def analyze(trace: dict, top: int = 20) -> dict:
    """Top kernels and the phase breakdown of a chrome trace (see the module docstring)."""
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "dur" in e]
    steps = [e for e in events if str(e.get("name", "")).startswith("ProfilerStep#")]
    if not steps:
        raise ValueError("the trace holds no ProfilerStep# ranges (no profiled step)")
    step_windows = Windows((e["ts"], e["ts"] + e["dur"]) for e in steps)
    wall = step_windows.total()

    def windows(pattern):
        return Windows((e["ts"], e["ts"] + e["dur"]) for e in events
                       if e.get("cat") in ("python_function", "cpu_op", "user_annotation")
                       and pattern.search(str(e.get("name", ""))))

    fwd, bwd, opt = windows(FORWARD), windows(BACKWARD), windows(OPTIMIZER)
    device = [e for e in events if e.get("cat") in DEVICE_CATS]
    if device:
        # runtime launches (cudaLaunchKernel...) and driver ones (cuLaunchKernel: Triton's kernels)
        launches = {e["args"]["correlation"]: e["ts"] for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver")
                    and "correlation" in e.get("args", {})}
        timed = [(e, float(e["dur"]), launches.get(e.get("args", {}).get("correlation"), e["ts"])) for e in device]
        busy = Windows((e["ts"], e["ts"] + e["dur"]) for e in device).total()
        kind = "device kernels (memcpy/memset included)"
    else:
        ops = [e for e in events if e.get("cat") == "cpu_op"]
        timed = [(e, t, e["ts"]) for e, t in _self_times(ops) if step_windows.holds(e["ts"])]
        busy = sum(t for _, t, _ in timed)
        kind = "cpu ops (self time)"
    phase = collections.Counter()
    by_name = collections.defaultdict(lambda: [0.0, 0])
    for e, t, launched in timed:
        name = str(e.get("name", "?"))
        by_name[name][0] += t
        by_name[name][1] += 1
        if COMM.search(name):
            phase["communication"] += t
        elif opt.holds(launched):
            phase["optimizer"] += t
        elif bwd.holds(launched):
            phase["backward"] += t
        elif fwd.holds(launched):
            phase["forward"] += t
        else:
            phase["other"] += t
    phase["idle"] = max(0.0, wall - busy)
    total = sum(t for t, _ in by_name.values()) or 1.0
    kernels = [{"name": n, "ms": t / 1000, "calls": c, "share_pct": 100 * t / total}
               for n, (t, c) in sorted(by_name.items(), key=lambda kv: -kv[1][0])[:top]]
    return {"kind": kind, "steps": len(steps), "wall_ms": wall / 1000, "busy_ms": busy / 1000,
            "phases_ms": {p: phase[p] / 1000 for p in PHASES},
            "phases_pct": {p: 100 * phase[p] / wall if wall else 0.0 for p in PHASES}, "top": kernels}


def render(result: dict, flags: list[str]) -> str:
    lines = [f"profile of {result['steps']} steps of the dense row ({' '.join(flags)}): wall {result['wall_ms']:.1f} "
             f"ms, {result['kind']} busy {result['busy_ms']:.1f} ms", "",
             "| phase | ms | share of wall |", "|---|---|---|"]
    lines += [f"| {p} | {result['phases_ms'][p]:.1f} | {result['phases_pct'][p]:.1f}% |" for p in PHASES]
    lines += ["", "| # | kernel | ms | calls | share |", "|---|---|---|---|---|"]
    lines += [f"| {i} | `{k['name'][:90]}` | {k['ms']:.2f} | {k['calls']} | {k['share_pct']:.1f}% |"
              for i, k in enumerate(result["top"], 1)]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", default="cpu", choices=["cpu", "cuda", "musa"])
    p.add_argument("--cpu-size", choices=("small", "tiny"), default="tiny")
    p.add_argument("--num-layers", default="auto", help="layers of the GPU dense model (as benchmarks/step.py)")
    p.add_argument("--warmup", type=int, default=2, help="steps before the two profiled ones")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default=".", help="folder for profile.json, profile.md, profile_trace.json.gz")
    a = p.parse_args(argv)
    models = step.model_flags(a.backend, a.cpu_size, quick=False, num_layers=a.num_layers, moe_num_layers="1")
    flags = ["--backend", a.backend, *step.COMMON, *models["dense"], "--transformer-impl", "mtmegatron",
             "--cross-entropy-loss-fusion"]
    first, end = a.warmup + 1, a.warmup + 3  # iterations first, first+1 recorded (training/observability/profiler.py)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
        env["OMP_NUM_THREADS"] = str(a.threads)
        cmd = [sys.executable, "-m", "mtmegatron.pretrain", *flags, "--train-iters", str(end),
               "--log-dir", f"{tmp}/log", "--tensorboard-dir", f"{tmp}/tb", "--profile", "--use-pytorch-profiler",
               "--profile-step-start", str(first), "--profile-step-end", str(end)]
        print("$", " ".join(cmd), flush=True)
        done = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if done.returncode != 0:
            print(done.stdout[-3000:], done.stderr[-3000:], sep="\n", flush=True)
            print(f"profile: the profiled run failed ({done.returncode})", flush=True)
            return 1
        traces = sorted(Path(tmp, "tb").rglob("*.pt.trace.json*"))
        if not traces:
            print(f"profile: no trace in {tmp}/tb", flush=True)
            return 1
        opener = gzip.open if traces[0].suffix == ".gz" else open
        with opener(traces[0], "rt") as f:
            trace = json.load(f)
        with open(traces[0], "rb") as src, gzip.open(out / "profile_trace.json.gz", "wb") as dst:
            shutil.copyfileobj(gzip.GzipFile(fileobj=src) if traces[0].suffix == ".gz" else src, dst)
    result = analyze(trace)
    result.update(flags=flags, trace="profile_trace.json.gz")
    (out / "profile.json").write_text(json.dumps(result, indent=1))
    text = render(result, models["dense"])
    (out / "profile.md").write_text(text)
    print(text, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
