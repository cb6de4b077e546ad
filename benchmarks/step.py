"""Training step time of mtmegatron, one run, one table: each ``--transformer-impl`` available here (local,
mtmegatron; transformer_engine where TransformerEngine imports), Megatron-LM's fusions on / off / each one off,
FP8 (hybrid, tensorwise, torch._scaled_mm) vs bf16, grouped-GEMM MoE experts on / off, against its peers on the
same shapes and device (``--peers``: Megatron-LM core_v0.16.1's own pretrain_gpt.py with --transformer-impl local,
benchmarks/peer_megatron_lm.py; torchtitan 0.3's Llama-3 model and step, benchmarks/peer_torchtitan.py, or the
reason it cannot run), a plain-PyTorch training loop of the same model (bf16, and with torchao's float8 training
where torchao imports: FP8 without TransformerEngine) and the GEMM + attention bound measured in the same run
(benchmarks/step_baselines.py). Every row has its peak memory (the device allocator's peak on a GPU; on the cpu
the process's resident memory, n/a for the in-process plain loop).

Each "ours" row is one ``python -m mtmegatron.pretrain`` process (one rank, mock data) whose per-iteration
``step_time_ms`` (metrics.jsonl) is read back; the row shows the median after ``--warmup`` iterations (the fastest
of ``--repeats`` processes), the model TFLOP/s (Megatron-LM's FLOP formula, training/observability/throughput.py), MFU against
the device's datasheet bf16 peak where it is known and against an n^3 matrix product measured at the start of the
same run (``--matmul-size``, 8192 bf16 on a GPU), the ratio to the plain loop and to the bound of the same model,
and which fusions the run's start-up line says ran. Rows run most telling first (impls with fusions on, then off,
FP8 vs bf16, MoE sequential vs grouped), so a run cut short by a time limit keeps the comparisons that matter;
``--json`` rewrites every figure to a file after each row for the same reason.
Models: on CPU a small (``--cpu-size tiny``: tiny) Llama-3 (dense) and Mixtral (MoE) of the same layer shapes,
fp32 (FP8 rows, with ``--fp8 on``, get bf16 parameters and a bf16 row of their own), 2 micro-batches a step; on a
GPU (``--backend cuda|musa``) the representative shapes: a Llama-3-8B-shaped model with ``--num-layers`` layers
(auto: as many as fit the device, at most 8), Mixtral-8x7B's layers (``--moe-num-layers``), bf16, 8 micro-batches
of 1 x 4096 tokens (gradient accumulation: the optimizer step amortised as in real training), the distributed
optimizer; ``--quick`` keeps the first GPU runs' shapes (2 dense / 1 MoE layer, one micro-batch).
``--fusion-ab``: only the fusions table: each fusion the backend can run on vs off, processes interleaved (on, off,
on, off, ...) ``--repeats`` times, medians, spread, and the faster-or-equal verdict models/fusions.py applies.
Usage: python benchmarks/step.py [--backend cpu] [--cpu-size small|tiny] [--iters 6] [--threads 1] [--quick]
       [--impls local,mtmegatron] [--peers megatron-lm,torchtitan|none] [--megatron-lm DIR] [--fp8 auto|on|off]
       [--num-layers auto|N] [--moe-num-layers auto|N] [--no-ablation] [--matmul-size N] [--json F]
       [--fusion-ab --repeats 5]
Exit status 1 when a row's run failed (the table still shows every other row).
May assume: mtmegatron installed; torch >= 2.6; no launcher variables needed.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peer_megatron_lm  # noqa: E402
import peer_torchtitan  # noqa: E402
from step_baselines import bound_step_ms, flop_shares, plain_step_ms, synchronize  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

COMMON = ["--mock-data", "--lr", "1e-4", "--lr-decay-style", "constant", "--log-interval", "1000",
          "--hidden-dropout", "0", "--attention-dropout", "0"]
CPU_SHAPE = ["--num-layers", "2", "--hidden-size", "256", "--num-attention-heads", "8", "--num-query-groups", "4",
             "--ffn-hidden-size", "704", "--vocab-size", "8192", "--seq-length", "256",
             "--max-position-embeddings", "256", "--micro-batch-size", "2", "--global-batch-size", "2"]
# --cpu-size tiny: every code path in seconds (FP8 through torch._scaled_mm is ~100 s a step at the small shape on
# cpu, ~1 s here)
CPU_TINY_SHAPE = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--num-query-groups", "2",
                  "--ffn-hidden-size", "192", "--vocab-size", "1024", "--seq-length", "64",
                  "--max-position-embeddings", "64", "--micro-batch-size", "2", "--global-batch-size", "2"]
CPU_MODELS = {"dense": ["--model", "llama3", *CPU_SHAPE],
              "moe": ["--model", "mixtral", *CPU_SHAPE, "--num-experts", "4", "--moe-router-topk", "2"]}
CPU_TINY_MODELS = {"dense": ["--model", "llama3", *CPU_TINY_SHAPE],
                   "moe": ["--model", "mixtral", *CPU_TINY_SHAPE, "--num-experts", "4", "--moe-router-topk", "2"]}
# as real training runs: the distributed optimizer, and gradient accumulation so the optimizer step is amortised
# (GPU: 8 micro-batches of 1 x 4096 tokens; cpu: 2 micro-batches, so the path is the same)
REPRESENTATIVE = ["--use-distributed-optimizer"]
CPU_GLOBAL_BATCH = "4"  # with the cpu shapes' --micro-batch-size 2: 2 micro-batches
def _set(flags: list[str], name: str, value: str) -> list[str]:
    """``flags`` with ``name``'s value replaced."""
    i = flags.index(name)
    return [*flags[:i + 1], value, *flags[i + 2:]]


# an 8B layer (hidden 4096, ffn 14336, 32 heads / 8 groups, vocab 128256) and Mixtral-8x7B's MoE layer
GPU_MODELS = {"dense": ["--model", "llama3", "--model-size", "8b", "--seq-length", "4096",
                        "--max-position-embeddings", "4096", "--micro-batch-size", "1", "--global-batch-size", "8",
                        "--bf16", *REPRESENTATIVE],
              "moe": ["--model", "mixtral", "--model-size", "8x7b", "--seq-length", "4096",
                      "--max-position-embeddings", "4096", "--micro-batch-size", "1", "--global-batch-size", "8",
                      "--bf16", *REPRESENTATIVE]}
# --quick: the shapes of the first GPU runs (2026-11-28: 2 dense layers / 1 MoE layer, one micro-batch), so its
# figures compare with theirs
GPU_QUICK_MODELS = {k: [f for f in _set(v, "--global-batch-size", "1") if f not in REPRESENTATIVE]
                    for k, v in GPU_MODELS.items()}
# per-layer bytes at bf16 with the distributed optimizer (2 param + 4 main grad + 4 master + 8 Adam = 18 per
# parameter) plus a layer's activations at seq 4096, micro-batch 1; and what every model holds besides its layers
LAYER_GIB = {"dense": 5.0, "moe": 26.0}
FIXED_GIB = {"dense": 25.0, "moe": 8.0}
MAX_LAYERS = {"dense": 8, "moe": 2}  # more layers fit an H200 but lengthen each row past the step box
FUSIONS_OFF = ["--no-bias-dropout-fusion", "--no-bias-swiglu-fusion", "--no-rope-fusion",
               "--no-masked-softmax-fusion", "--no-persist-layer-norm", "--no-gradient-accumulation-fusion"]
# the fusion named in the start-up line -> what turns it off alone (cross-entropy: on only by its flag)
FUSION_OFF_FLAG = {"bias-dropout-add": "--no-bias-dropout-fusion", "bias-activation": "--no-bias-swiglu-fusion",
                   "rope": "--no-rope-fusion", "masked-softmax": "--no-masked-softmax-fusion",
                   "persist-layer-norm": "--no-persist-layer-norm",
                   "gradient-accumulation": "--no-gradient-accumulation-fusion", "cross-entropy": None}
FP8 = ["--fp8-format", "hybrid", "--fp8-recipe", "tensorwise", "--fp8-executor", "scaled_mm"]
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


def layers_that_fit(model: str, total_gib: float) -> int:
    """As many layers of ``model``'s GPU shape as fit ``total_gib`` of device memory (85% of it, the rest for the
    allocator and the loss), at most MAX_LAYERS[model], at least 1."""
    return max(1, min(MAX_LAYERS[model], int((0.85 * total_gib - FIXED_GIB[model]) / LAYER_GIB[model])))


def device_gib(backend: str) -> float:
    module = torch.get_device_module(backend)
    return module.get_device_properties(module.current_device()).total_memory / 2 ** 30


def model_flags(backend: str, cpu_size: str, quick: bool, num_layers: str, moe_num_layers: str) -> dict:
    """{"dense": flags, "moe": flags} of the benchmark models (see the module docstring); ``num_layers`` and
    ``moe_num_layers``: a number or "auto" (GPU: layers_that_fit; --quick: 2 and 1, the first GPU runs' shapes)."""
    if backend == "cpu":
        models = CPU_TINY_MODELS if cpu_size == "tiny" else CPU_MODELS
        return {k: _set(v, "--global-batch-size", CPU_GLOBAL_BATCH) + REPRESENTATIVE for k, v in models.items()}
    if backend == "musa":
        importlib.import_module("torch_musa")
    gpu = GPU_QUICK_MODELS if quick else GPU_MODELS
    layers = {}
    for model, given in (("dense", num_layers), ("moe", moe_num_layers)):
        if given != "auto":
            layers[model] = int(given)
        elif quick:
            layers[model] = 2 if model == "dense" else 1
        else:
            layers[model] = layers_that_fit(model, device_gib(backend))
    return {k: gpu[k] + ["--num-layers", str(layers[k])] for k in gpu}


def release(backend: str) -> None:
    """Give what this process's in-process rows (plain loop, bound, torchao) cached on the device back, so the
    next row's own process has the device's memory: the 8B-shaped models need most of it."""
    gc.collect()
    torch._dynamo.reset()  # compiled layers hold their modules
    if backend != "cpu":
        torch.get_device_module(backend).empty_cache()


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
               "--log-dir", log_dir, "--log-memory-to-tensorboard"]
        done = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if done.returncode != 0:
            return {"error": (done.stderr.strip().splitlines() or done.stdout.strip().splitlines() or ["?"])[-1]}
        with open(os.path.join(log_dir, "metrics.jsonl")) as f:
            rows = [json.loads(line) for line in f]
    fusions = next((l for l in done.stdout.splitlines() if "mtmegatron: fusions:" in l), "")
    running = fusions.split("running ", 1)[-1].split(" |", 1)[0] if fusions else "?"
    startup = sum(r["step_time_ms"] for r in rows[:warmup])  # compilation (jit fusions) lands here
    # the device allocator's peak (GPU) or the process's resident memory (cpu: no device allocator)
    peak = max((r.get("mem_max_allocated_bytes") or r.get("mem_rss_bytes") or 0 for r in rows), default=0)
    return {"ms": statistics.median(r["step_time_ms"] for r in rows[warmup:]), "fusions": running,
            "warmup_ms": startup, "peak_gib": peak / 2 ** 30 if peak else None}


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
    from mtmegatron.config.arguments import parse_args

    return parse_args(flags, world_size=1, for_training=False)


def model_tflop(flags: list[str]) -> float:
    from mtmegatron.training.observability.throughput import num_floating_point_operations

    args = parse(flags)
    return num_floating_point_operations(args, args.global_batch_size) / 1e12


def peak_tflops(backend: str) -> float | None:
    if backend == "cpu":
        return None
    from mtmegatron.training.observability.throughput import peak_bf16_tflops

    return peak_bf16_tflops(torch.get_device_module(backend).get_device_name())


def device_name(backend: str) -> str:
    if backend == "cpu":
        return f"cpu ({os.cpu_count()} cores)"
    return torch.get_device_module(backend).get_device_name()


def matmul_tflops(device: torch.device, n: int, dtype: torch.dtype, reps: int = 10) -> float:
    """TFLOP/s of an n x n x n matrix product on random data, the mean of ``reps`` products after 3 warm-ups:
    the peak this device reaches in this run, the second denominator of MFU."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    for _ in range(3):
        a @ b
    synchronize(device)
    start = time.perf_counter()
    for _ in range(reps):
        a @ b
    synchronize(device)
    return 2 * n ** 3 * reps / (time.perf_counter() - start) / 1e12


PEERS = {"megatron-lm": "Megatron-LM pretrain_gpt.py, local", "torchtitan": "torchtitan Llama-3 train step"}


PLAIN_COMPILED = "plain PyTorch loop, compiled layers"
TORCHAO = ROOT / ".device/peers/torchao"


def torchao_here() -> bool:
    """torchao importable (installed, or unpacked by scripts/device_bundle.sh into .device/peers/torchao, which is
    then put on sys.path)."""
    if importlib.util.find_spec("torchao") is None and (TORCHAO / "torchao").is_dir():
        sys.path.insert(0, str(TORCHAO))
    return importlib.util.find_spec("torchao") is not None


def rows_to_run(backend: str, impls: list[str], fp8: bool, quick: bool,
                peers: tuple[str, ...] = (), torchao: bool = False) -> list[tuple[str, str, list[str]]]:
    """(row name, model, extra flags) for every row after the plain loop and the bound, most telling first (a run
    cut short by a time limit keeps the comparisons that matter): fusions on per impl, the peers on the dense model
    (``["@megatron-lm"]``, ``["@torchtitan"]``: their own trainers), the last impl's FP8 vs bf16, torchao's float8
    training on the plain loop vs its bf16 (``["@plain", recipe]``; ``torchao``: where it imports), MoE grouped
    GEMM per impl and Megatron-LM's MoE (sequential experts: its local grouped GEMM needs the grouped_gemm
    package); then the other impls' FP8, fusions off, MoE sequential per impl. ``quick``: the first impl and
    Megatron-LM only, no torchao."""
    impls = impls[:1] if quick else impls
    peers = tuple(p for p in peers if not quick or p == "megatron-lm")
    torchao = torchao and not quick
    on = {impl: ["--transformer-impl", impl, "--cross-entropy-loss-fusion"] for impl in impls}
    rows = [(f"{impl}, fusions on", "dense", on[impl]) for impl in impls]
    rows += [(PEERS[peer], "dense", [f"@{peer}"]) for peer in peers]
    fp8_rows = []
    if fp8:
        for impl in impls:
            if backend == "cpu":  # the cpu models are fp32: FP8 is compared with bf16 parameters of its own
                fp8_rows.append((f"{impl}, fusions on, bf16", "dense", on[impl] + ["--bf16"]))
            fp8_rows.append((f"{impl}, fusions on, FP8 tensorwise scaled_mm", "dense",
                             on[impl] + FP8 + (["--bf16"] if backend == "cpu" else [])))
    # mtmegatron's (the last impl's) FP8 first, then torchao's float8 training on the plain loop: does FP8 without
    # TransformerEngine beat bf16 on this device (compiled layers on a GPU, where its casts fuse)?
    rows += fp8_rows[-(2 if backend == "cpu" else 1):] if fp8_rows else []
    if fp8 and torchao:
        plain = PLAIN_COMPILED if backend != "cpu" else "plain PyTorch loop, eager"
        rows += [(f"{plain}, bf16", "dense", ["@plain", "bf16"])]
        rows += [(f"{plain}, torchao float8 {r}", "dense", ["@plain", r]) for r in ("tensorwise", "rowwise")]
    rows += [(f"{impl}, MoE grouped GEMM", "moe", on[impl] + ["--moe-grouped-gemm"]) for impl in impls]
    if "megatron-lm" in peers:
        rows.append((f"{PEERS['megatron-lm']}, MoE sequential experts", "moe", ["@megatron-lm"]))
    if quick:
        return rows
    rows += fp8_rows[:-(2 if backend == "cpu" else 1)]
    rows += [(f"{impl}, fusions off", "dense", ["--transformer-impl", impl, *FUSIONS_OFF]) for impl in impls]
    rows += [(f"{impl}, MoE sequential experts", "moe", on[impl]) for impl in impls]
    return rows


def ablation_rows(impl: str, running: str) -> list[tuple[str, str, list[str]]]:
    """One row per fusion that ran in ``impl``'s "fusions on" row: everything on but that one."""
    rows = []
    for name in [n.strip() for n in running.split(",") if n.strip() and n.strip() != "none"]:
        off = FUSION_OFF_FLAG.get(name)
        flags = ["--transformer-impl", impl] + ([off, "--cross-entropy-loss-fusion"] if off else [])
        rows.append((f"{impl}, fusions on but {name}", "dense", flags))
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", default="cpu", choices=["cpu", "cuda", "musa"])
    p.add_argument("--iters", type=int, default=6)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=int, default=1, help="OMP threads of every process (CPU)")
    p.add_argument("--repeats", type=int, default=1,
                   help="processes per row; the row shows the fastest (other load on the machine only slows)")
    p.add_argument("--num-layers", default="auto",
                   help="layers of the GPU dense model; auto: as many as fit the device (layers_that_fit, at most "
                        f"{MAX_LAYERS['dense']}; 2 with --quick)")
    p.add_argument("--cpu-size", choices=("small", "tiny"), default="small",
                   help="the cpu models: small (hidden 256, seq 256) or tiny (hidden 64, seq 64: each path in seconds)")
    p.add_argument("--moe-num-layers", default="auto",
                   help=f"layers of the GPU MoE model (Mixtral-8x7B's); auto: as many as fit, at most "
                        f"{MAX_LAYERS['moe']} (1 with --quick)")
    p.add_argument("--peers", type=lambda s: tuple(i for i in s.split(",") if i and i != "none"),
                   default=tuple(PEERS), help=f"peer trainers on the same shapes: {','.join(PEERS)} or none")
    p.add_argument("--megatron-lm", default=None,
                   help="an extracted Megatron-LM core_v0.16.1 tree (default: .device/peers/megatron-lm, else a "
                        "git archive of the local clone)")
    p.add_argument("--impls", type=lambda s: [i for i in s.split(",") if i], default=None,
                   help="comma-separated --transformer-impl values (default: every one that imports here)")
    p.add_argument("--fp8", choices=("auto", "on", "off"), default="auto",
                   help="FP8 (hybrid, tensorwise, scaled_mm) vs bf16 rows; auto: on a GPU only")
    p.add_argument("--no-ablation", action="store_true", help="no 'fusions on but X' rows")
    p.add_argument("--matmul-size", type=int, default=None,
                   help="n of the n^3 matrix product measured as this run's peak (default 8192 on a GPU, 2048 on "
                        "cpu; 0 skips it)")
    p.add_argument("--json", default=None, help="also write every figure to this file (rewritten after each row)")
    p.add_argument("--quick", action="store_true", help="the first impl only, no per-fusion rows")
    p.add_argument("--fusion-ab", action="store_true",
                   help="only the fusions table: each fusion on vs off, --repeats interleaved pairs of processes, "
                        "medians and spread (the measurement behind models/fusions.py's cpu decisions)")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    unknown = [peer for peer in a.peers if peer not in PEERS]
    if unknown:
        p.error(f"--peers: unknown {', '.join(unknown)} (known: {', '.join(PEERS)}, none)")
    models = model_flags(a.backend, a.cpu_size, a.quick, a.num_layers, a.moe_num_layers)
    base = {k: ["--backend", a.backend, *COMMON, *v] for k, v in models.items()}
    if a.fusion_ab:
        print(f"backend {a.backend}, {a.iters} timed iterations after {a.warmup}, OMP_NUM_THREADS={a.threads}; "
              f"model: {' '.join(models['dense'])}", flush=True)
        fusion_ab(base["dense"], a)
        return 0
    device = torch.device(a.backend)
    peak = peak_tflops(a.backend)
    mm_size = a.matmul_size if a.matmul_size is not None else (2048 if a.backend == "cpu" else 8192)
    mm_dtype = torch.float32 if a.backend == "cpu" else torch.bfloat16
    mm_peak = matmul_tflops(device, mm_size, mm_dtype) if mm_size else None
    report = {"backend": a.backend, "device": device_name(a.backend), "torch": torch.__version__,
              "iters": a.iters, "warmup": a.warmup, "threads": a.threads, "repeats": a.repeats,
              "peak_datasheet_bf16_tflops": peak,
              "matmul": {"n": mm_size, "dtype": str(mm_dtype).replace("torch.", ""), "tflops": mm_peak},
              "models": {}, "rows": []}

    def save() -> None:
        if a.json:
            with open(a.json, "w") as f:
                json.dump(report, f, indent=1)

    mm = "" if mm_peak is None else f", measured {mm_size}^3 {report['matmul']['dtype']} matmul {mm_peak:.4g} TFLOP/s"
    print(f"backend {a.backend} ({report['device']}), {a.iters} timed iterations after {a.warmup}, "
          f"OMP_NUM_THREADS={a.threads}{'' if peak is None else f', datasheet bf16 peak {peak:.0f} TFLOP/s'}{mm}",
          flush=True)
    reference, tflop = {}, {}
    for model, flags in base.items():
        args = parse(flags)
        tflop[model] = model_tflop(flags)
        plain_ms, plain_gib = plain_step_ms(args, device, a.iters, a.warmup, with_peak=True)
        reference[model] = {"plain": plain_ms, "plain_gib": plain_gib, "bound": bound_step_ms(args, device)}
        release(a.backend)
        report["models"][model] = {"flags": models[model], "tflop_per_step": tflop[model],
                                   "plain_ms": reference[model]["plain"], "bound_ms": reference[model]["bound"],
                                   "layers": args.num_layers, "micro_batches": args.global_batch_size
                                   // args.micro_batch_size, "flop_shares": flop_shares(args)}
        print(f"  {model}: {' '.join(models[model])}", flush=True)
    save()

    header = (f"{'row':<46} {'model':<6} {'ms/step':>9} {'TFLOP/s':>8} {'MFU':>6} {'MFU/mm':>7} {'/plain':>7} "
              f"{'/bound':>7} {'peak GiB':>8}  fusions running")
    print(header)
    print("-" * len(header))

    def show(name: str, model: str, ms: float, fusions: str = "", peak_gib: float | None = None,
             model_tflop_step: float | None = None) -> None:
        """``model_tflop_step``: the row ran another size of ``model`` (fewer layers): its own FLOPs, and no ratio to
        the plain loop or the bound (those are of the full size)."""
        tf = (model_tflop_step or tflop[model]) / (ms / 1000)
        mfu = 100 * tf / peak if peak else None
        mfu_mm = 100 * tf / mm_peak if mm_peak else None
        row = {"row": name, "model": model, "ms": ms, "tflops": tf, "mfu_datasheet_pct": mfu,
               "mfu_matmul_pct": mfu_mm, "vs_plain": None if model_tflop_step else ms / reference[model]["plain"],
               "vs_bound": None if model_tflop_step else ms / reference[model]["bound"], "fusions": fusions,
               "peak_gib": peak_gib}
        report["rows"].append(row)
        save()
        pct = lambda v: "n/a" if v is None else f"{v:.1f}%"  # noqa: E731
        gib = "n/a" if peak_gib is None else f"{peak_gib:.2f}"
        ratio = lambda v: "n/a" if v is None else f"{v:.2f}"  # noqa: E731
        print(f"{name:<46} {model:<6} {ms:9.1f} {tf:8.4g} {pct(mfu):>6} {pct(mfu_mm):>7} {ratio(row['vs_plain']):>7} "
              f"{ratio(row['vs_bound']):>7} {gib:>8}  {fusions}", flush=True)

    for model in base:
        show("plain PyTorch loop", model, reference[model]["plain"], peak_gib=reference[model]["plain_gib"])
        show("GEMM + attention bound", model, reference[model]["bound"])
    impls = a.impls or available_impls()
    fp8 = a.fp8 == "on" or (a.fp8 == "auto" and a.backend != "cpu")
    rows = rows_to_run(a.backend, impls, fp8, a.quick, a.peers, torchao=fp8 and torchao_here())
    peer_source = {}

    def run_row(model: str, extra: list[str], flags: list[str] | None = None) -> dict:
        flags = flags or base[model]
        if extra[:1] == ["@megatron-lm"]:
            if "megatron-lm" not in peer_source:
                peer_source["megatron-lm"] = peer_megatron_lm.find_source(a.megatron_lm)
                report["megatron_lm_source"] = peer_source["megatron-lm"][1]
            mlm, why = peer_source["megatron-lm"]
            if mlm is None:
                return {"error": why}
            mlm_flags = peer_megatron_lm.megatron_lm_flags(parse(flags), a.backend, a.warmup + a.iters)
            return peer_megatron_lm.run(mlm, a.backend, mlm_flags, a.warmup, a.threads)
        if extra[:1] == ["@plain"]:  # in this process: torchao's float8 (or bf16) on the plain loop
            recipe = None if extra[1] == "bf16" else extra[1]
            try:
                ms, gib = plain_step_ms(parse(base[model] + (["--bf16"] if a.backend == "cpu" else [])), device,
                                        a.iters, a.warmup, with_peak=True, float8=recipe,
                                        compile_layers=a.backend != "cpu")
            except Exception as e:  # noqa: BLE001 -- the row says why
                return {"error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"}
            finally:
                release(a.backend)
            return {"ms": ms, "peak_gib": gib, "fusions": "torch.compile per layer" if a.backend != "cpu" else
                    "eager (cpu)"}
        if extra[:1] == ["@torchtitan"]:
            return peer_torchtitan.run(flags, a.backend, a.iters, a.warmup, a.threads)
        return run_ours(flags + extra, a.iters, a.warmup, a.threads)

    done = 0
    while done < len(rows):
        name, model, extra = rows[done]
        runs = [run_row(model, extra) for _ in range(a.repeats)]
        result = next((r for r in runs if "error" in r or "skip" in r), None) or min(runs, key=lambda r: r["ms"])
        if "skip" in result:  # a peer that cannot exist on this backend: the reason, not a failure
            report["rows"].append({"row": name, "model": model, "skipped": result["skip"]})
            save()
            print(f"{name:<46} {model:<6} not run: {result['skip']}", flush=True)
            done += 1
            continue
        layers = int(base[model][base[model].index("--num-layers") + 1]) if "--num-layers" in base[model] else 0
        if "error" in result and extra[0] in ("@megatron-lm", "@torchtitan") and layers > 1 and re.search(
                r"out of memory|OutOfMemory", result["error"], re.IGNORECASE):
            # a peer that does not fit at our size (Megatron-LM's local attention keeps the s x s scores): its
            # figures at half the layers, against that size's FLOPs, no ratio to the full-size plain loop or bound
            half = _set(base[model], "--num-layers", str(layers // 2))
            retry = run_row(model, extra, half)
            if "error" not in retry:
                report["rows"].append({"row": f"{name}, {layers} layers", "model": model, "error": result["error"]})
                name, result = f"{name}, {layers // 2} layers (out of memory at {layers})", retry
                result["model_tflop_step"] = model_tflop(half)
        if "error" in result:
            report["rows"].append({"row": name, "model": model, "error": result["error"]})
            save()
            print(f"{name:<46} {model:<6} failed: {result['error']}", flush=True)
        else:
            show(name, model, result["ms"], result["fusions"], result.get("peak_gib"), result.get("model_tflop_step"))
            if name.endswith("fusions on") and not (a.quick or a.no_ablation):
                rows += ablation_rows(name.split(",")[0], result["fusions"])
        done += 1
    failed = [r["row"] for r in report["rows"] if "error" in r]
    if failed:
        print(f"{len(failed)} rows failed: {', '.join(failed)}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
