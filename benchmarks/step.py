"""Training step time of mtmegatron, one run, one table: each ``--transformer-impl`` available here (local,
mtmegatron; transformer_engine where TransformerEngine imports), Megatron-LM's fusions on / off / each one off,
grouped-GEMM MoE experts on / off, FP8 vs bf16 on a GPU, against a plain-PyTorch training loop of the same model
and against the GEMM + attention bound measured in the same run (benchmarks/step_baselines.py).

Each "ours" row is one ``python -m mtmegatron.pretrain`` process (one rank, mock data) whose per-iteration
``step_time_ms`` (metrics.jsonl) is read back; the row shows the median after ``--warmup`` iterations (the fastest
of ``--repeats`` processes), the model
TFLOP/s (Megatron-LM's FLOP formula, training/throughput.py), MFU where the device's bf16 peak is known, the ratio
to the plain loop and to the bound of the same model, and which fusions the run's start-up line says ran.
Models: on CPU a small Llama-3 (dense) and Mixtral (MoE) of the same layer shapes, fp32; on a GPU
(``--backend cuda|musa``) a Llama-3-8B-shaped model with ``--num-layers`` layers, bf16, and Mixtral-8x7B's layer.
``--fusion-ab``: only the fusions table: each fusion the backend can run on vs off, processes interleaved (on, off,
on, off, ...) ``--repeats`` times, medians, spread, and the faster-or-equal verdict models/fusions.py applies.
Usage: python benchmarks/step.py [--backend cpu] [--iters 6] [--threads 1] [--quick] [--fusion-ab --repeats 5]
May assume: mtmegatron installed; torch >= 2.6; no launcher variables needed.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from step_baselines import bound_step_ms, plain_step_ms  # noqa: E402

COMMON = ["--mock-data", "--lr", "1e-4", "--lr-decay-style", "constant", "--log-interval", "1000",
          "--hidden-dropout", "0", "--attention-dropout", "0"]
CPU_SHAPE = ["--num-layers", "2", "--hidden-size", "256", "--num-attention-heads", "8", "--num-query-groups", "4",
             "--ffn-hidden-size", "704", "--vocab-size", "8192", "--seq-length", "256",
             "--max-position-embeddings", "256", "--micro-batch-size", "2", "--global-batch-size", "2"]
CPU_MODELS = {"dense": ["--model", "llama3", *CPU_SHAPE],
              "moe": ["--model", "mixtral", *CPU_SHAPE, "--num-experts", "4", "--moe-router-topk", "2"]}
# an 8B layer (hidden 4096, ffn 14336, 32 heads / 8 groups, vocab 128256) and Mixtral-8x7B's MoE layer
GPU_MODELS = {"dense": ["--model", "llama3", "--model-size", "8b", "--seq-length", "4096",
                        "--max-position-embeddings", "4096", "--micro-batch-size", "1", "--global-batch-size", "1",
                        "--bf16"],
              "moe": ["--model", "mixtral", "--model-size", "8x7b", "--seq-length", "4096",
                      "--max-position-embeddings", "4096", "--micro-batch-size", "1", "--global-batch-size", "1",
                      "--bf16"]}
FUSIONS_OFF = ["--no-bias-dropout-fusion", "--no-bias-swiglu-fusion", "--no-rope-fusion",
               "--no-masked-softmax-fusion", "--no-persist-layer-norm", "--no-gradient-accumulation-fusion"]
# the fusion named in the start-up line -> what turns it off alone (cross-entropy: on only by its flag)
FUSION_OFF_FLAG = {"bias-dropout-add": "--no-bias-dropout-fusion", "bias-activation": "--no-bias-swiglu-fusion",
                   "rope": "--no-rope-fusion", "masked-softmax": "--no-masked-softmax-fusion",
                   "persist-layer-norm": "--no-persist-layer-norm",
                   "gradient-accumulation": "--no-gradient-accumulation-fusion", "cross-entropy": None}
FP8 = ["--fp8-format", "hybrid", "--fp8-recipe", "tensorwise"]
# --fusion-ab: (fusion, its "on" flags, its "off" flags), everything else equal, dense model. mtmegatron's RMSNorm
# and SwiGLU come with --transformer-impl mtmegatron (no flag each): that row holds RoPE and the loss equal.
FUSION_AB = [
    ("rope (ours, --transformer-impl mtmegatron)", ["--transformer-impl", "mtmegatron"],
     ["--transformer-impl", "mtmegatron", "--no-rope-fusion"]),
    ("cross-entropy (ours, --cross-entropy-loss-fusion)", ["--transformer-impl", "local", "--cross-entropy-loss-fusion"],
     ["--transformer-impl", "local"]),
    ("RMSNorm + SwiGLU (ours: mtmegatron vs local)",
     ["--transformer-impl", "mtmegatron", "--no-rope-fusion"],
     ["--transformer-impl", "local", "--cross-entropy-loss-fusion"]),
    ("bias-dropout-add (megatron-core jit)", ["--transformer-impl", "local", "--no-bias-swiglu-fusion"],
     ["--transformer-impl", "local", "--no-bias-swiglu-fusion", "--no-bias-dropout-fusion"]),
    ("bias-SwiGLU (megatron-core jit)", ["--transformer-impl", "local", "--no-bias-dropout-fusion"],
     ["--transformer-impl", "local", "--no-bias-dropout-fusion", "--no-bias-swiglu-fusion"]),
]


def available_impls() -> list[str]:
    impls = ["local", "mtmegatron"]
    if importlib.util.find_spec("transformer_engine") is not None:
        impls.append("transformer_engine")
    return impls


def run_ours(flags: list[str], iters: int, warmup: int, threads: int, env_extra: dict | None = None) -> dict:
    """One pretrain process; its median step time after warmup and its fusions/layers start-up lines."""
    with tempfile.TemporaryDirectory() as log_dir:
        # one rank, no launcher: its store binds a port the kernel picks (training/setup.py)
        env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
        env.update(OMP_NUM_THREADS=str(threads), **(env_extra or {}))
        cmd = [sys.executable, "-m", "mtmegatron.pretrain", *flags, "--train-iters", str(warmup + iters),
               "--log-dir", log_dir]
        done = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if done.returncode != 0:
            return {"error": (done.stderr.strip().splitlines() or done.stdout.strip().splitlines() or ["?"])[-1]}
        with open(os.path.join(log_dir, "metrics.jsonl")) as f:
            rows = [json.loads(line) for line in f]
    fusions = next((l for l in done.stdout.splitlines() if "mtmegatron: fusions:" in l), "")
    running = fusions.split("running ", 1)[-1].split(" |", 1)[0] if fusions else "?"
    startup = sum(r["step_time_ms"] for r in rows[:warmup])  # compilation (jit fusions) lands here
    return {"ms": statistics.median(r["step_time_ms"] for r in rows[warmup:]), "fusions": running,
            "warmup_ms": startup}


def fusion_ab(base: list[str], a) -> None:
    """Each fusion on vs off: ``--repeats`` pairs of processes run interleaved (on, off, on, off, ...) so other
    load on the machine hits both alike; medians of the per-process step times, their spread (min-max), and
    whether "on" is faster or equal (the rule models/fusions.py applies on this backend)."""
    print(f"fusions on vs off, {a.repeats} interleaved pairs of processes per fusion, dense model; megatron-core's "
          f"jit rows run with MTMEGATRON_CPU_JIT_FUSIONS=1, the rope row with MTMEGATRON_CPU_ROPE_FUSION=1 on cpu",
          flush=True)
    header = (f"{'fusion':<50} {'on ms':>8} {'(min-max)':>15} {'off ms':>8} {'(min-max)':>15} {'on/off':>7} "
              f"{'warmup on/off s':>16}  verdict")
    print(header)
    print("-" * len(header))
    for name, on_flags, off_flags in FUSION_AB:
        env = {}  # on cpu, what models/fusions.py keeps off there runs only when asked for (the other rows: default)
        if a.backend == "cpu" and "jit" in name:
            env["MTMEGATRON_CPU_JIT_FUSIONS"] = "1"
        if a.backend == "cpu" and name.startswith("rope"):
            env["MTMEGATRON_CPU_ROPE_FUSION"] = "1"
        on, off = [], []
        for _ in range(a.repeats):
            on.append(run_ours(base + on_flags, a.iters, a.warmup, a.threads, env))
            off.append(run_ours(base + off_flags, a.iters, a.warmup, a.threads, env))
        failed = next((r for r in on + off if "error" in r), None)
        if failed:
            print(f"{name:<50} failed: {failed['error']}", flush=True)
            continue
        ms_on, ms_off = [r["ms"] for r in on], [r["ms"] for r in off]
        m_on, m_off = statistics.median(ms_on), statistics.median(ms_off)
        w_on = statistics.median(r["warmup_ms"] for r in on) / 1000
        w_off = statistics.median(r["warmup_ms"] for r in off) / 1000
        verdict = "on: faster or equal" if m_on <= m_off else "off: on is slower"
        print(f"{name:<50} {m_on:8.1f} {f'({min(ms_on):.0f}-{max(ms_on):.0f})':>15} {m_off:8.1f} "
              f"{f'({min(ms_off):.0f}-{max(ms_off):.0f})':>15} {m_on / m_off:7.3f} {f'{w_on:.1f}/{w_off:.1f}':>16}  "
              f"{verdict}   [on runs: {on[0]['fusions']}]", flush=True)


def parse(flags: list[str]):
    from mtmegatron.training.arguments import parse_args

    return parse_args(flags, world_size=1, for_training=False)


def model_tflop(flags: list[str]) -> float:
    from mtmegatron.training.throughput import num_floating_point_operations

    args = parse(flags)
    return num_floating_point_operations(args, args.global_batch_size) / 1e12


def peak_tflops(backend: str) -> float | None:
    if backend == "cpu":
        return None
    from mtmegatron.training.throughput import peak_bf16_tflops

    return peak_bf16_tflops(torch.get_device_module(backend).get_device_name())


def rows_to_run(backend: str, quick: bool) -> list[tuple[str, str, list[str]]]:
    """(row name, model, extra flags) for every "ours" row."""
    rows = []
    for impl in available_impls():
        on = ["--transformer-impl", impl, "--cross-entropy-loss-fusion"]
        rows.append((f"{impl}, fusions on", "dense", on))
        rows.append((f"{impl}, fusions off", "dense", ["--transformer-impl", impl, *FUSIONS_OFF]))
        if backend != "cpu":
            rows.append((f"{impl}, fusions on, FP8 tensorwise", "dense", on + FP8))
        rows.append((f"{impl}, MoE sequential experts", "moe", on))
        rows.append((f"{impl}, MoE grouped GEMM", "moe", on + ["--moe-grouped-gemm"]))
        if quick:
            break
    return rows


def ablation_rows(impl: str, running: str) -> list[tuple[str, str, list[str]]]:
    """One row per fusion that ran in ``impl``'s "fusions on" row: everything on but that one."""
    rows = []
    for name in [n.strip() for n in running.split(",") if n.strip() and n.strip() != "none"]:
        off = FUSION_OFF_FLAG.get(name)
        flags = ["--transformer-impl", impl] + ([off, "--cross-entropy-loss-fusion"] if off else [])
        rows.append((f"{impl}, fusions on but {name}", "dense", flags))
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", default="cpu", choices=["cpu", "cuda", "musa"])
    p.add_argument("--iters", type=int, default=6)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=int, default=1, help="OMP threads of every process (CPU)")
    p.add_argument("--repeats", type=int, default=1,
                   help="processes per row; the row shows the fastest (other load on the machine only slows)")
    p.add_argument("--num-layers", type=int, default=2, help="layers of the GPU models")
    p.add_argument("--quick", action="store_true", help="the first impl only, no per-fusion rows")
    p.add_argument("--fusion-ab", action="store_true",
                   help="only the fusions table: each fusion on vs off, --repeats interleaved pairs of processes, "
                        "medians and spread (the measurement behind models/fusions.py's cpu decisions)")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    models = CPU_MODELS if a.backend == "cpu" else {k: v + ["--num-layers", str(a.num_layers)]
                                                   for k, v in GPU_MODELS.items()}
    base = {k: ["--backend", a.backend, *COMMON, *v] for k, v in models.items()}
    if a.fusion_ab:
        print(f"backend {a.backend}, {a.iters} timed iterations after {a.warmup}, OMP_NUM_THREADS={a.threads}; "
              f"model: {' '.join(models['dense'])}", flush=True)
        fusion_ab(base["dense"], a)
        return
    device = torch.device(a.backend)
    peak = peak_tflops(a.backend)

    print(f"backend {a.backend}, {a.iters} timed iterations after {a.warmup}, OMP_NUM_THREADS={a.threads}"
          f"{'' if peak is None else f', bf16 peak {peak:.0f} TFLOP/s'}", flush=True)
    reference, tflop = {}, {}
    for model, flags in base.items():
        args = parse(flags)
        tflop[model] = model_tflop(flags)
        reference[model] = {"plain": plain_step_ms(args, device, a.iters, a.warmup), "bound": bound_step_ms(args, device)}
        print(f"  {model}: {' '.join(models[model])}", flush=True)

    header = (f"{'row':<46} {'model':<6} {'ms/step':>9} {'TFLOP/s':>8} {'MFU':>6} {'/plain':>7} {'/bound':>7}"
              f"  fusions running")
    print(header)
    print("-" * len(header))

    def show(name: str, model: str, ms: float, fusions: str = "") -> None:
        tf = tflop[model] / (ms / 1000)
        mfu = f"{100 * tf / peak:5.1f}%" if peak else "   n/a"
        print(f"{name:<46} {model:<6} {ms:9.1f} {tf:8.3f} {mfu:>6} {ms / reference[model]['plain']:7.2f} "
              f"{ms / reference[model]['bound']:7.2f}  {fusions}", flush=True)

    for model in base:
        show("plain PyTorch loop", model, reference[model]["plain"])
        show("GEMM + attention bound", model, reference[model]["bound"])
    rows = rows_to_run(a.backend, a.quick)
    done = 0
    while done < len(rows):
        name, model, extra = rows[done]
        runs = [run_ours(base[model] + extra, a.iters, a.warmup, a.threads) for _ in range(a.repeats)]
        result = next((r for r in runs if "error" in r), None) or min(runs, key=lambda r: r["ms"])
        if "error" in result:
            print(f"{name:<46} {model:<6} failed: {result['error']}", flush=True)
        else:
            show(name, model, result["ms"], result["fusions"])
            if name.endswith("fusions on") and not a.quick:
                rows[done + 1:done + 1] = ablation_rows(name.split(",")[0], result["fusions"])
        done += 1


if __name__ == "__main__":
    main()
