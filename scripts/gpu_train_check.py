"""GPU lane: end-to-end training checks of a device backend against the CPU backend (UNVERIFIED so far: written
without a GPU; its comparison and reporting are tested on the CPU with --backend-under-test cpu).

For tiny Llama-3, Mixtral and DeepSeek-V3 (mock data), in fp32 and --bf16:
  * a 1-rank `python -m mtmegatron.pretrain --backend B` run: losses finite and falling;
  * its first-iteration loss vs the same command on --backend cpu (1 iteration): |diff| <= 1e-5 fp32, 1e-3 bf16;
  * with >= 2 devices, a 2-rank TP2+SP torchrun: first-iteration loss vs the 1-rank run (same tolerances).
Then the fused kernels against their CPU reference (scripts/gpu_kernels.py, fp32, max abs err <= 1e-3, and
native kernels must be registered), and FP8 (e4m3, tensorwise) with every executor that imports
(scaled_mm, transformer_engine, emulated): losses finite and falling, first loss within 5% of the bf16 run.
The training and FP8 runs are independent processes: ``--jobs N`` runs N at a time (device runs beside the CPU
reference runs; each child gets OMP_NUM_THREADS = cores / N unless it is set). Prints one table (and, with
``--json``, writes it with every run's losses); exit status 1 when any check fails.

Usage: python scripts/gpu_train_check.py [--backend-under-test cuda] [--models llama3,mixtral,deepseek-v3]
       [--dtypes fp32,bf16] [--train-iters 20] [--tp2 auto|on|off] [--skip-kernels] [--skip-fp8] [--work-dir D]
       [--fp8-executors scaled_mm,transformer_engine,emulated] [--jobs 1] [--json F]
May assume: mtmegatron and megatron-core installed; torch >= 2.6 (torch.accelerator); torchrun on PATH for TP2.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import re
import socket
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODELS = ("llama3", "mixtral", "deepseek-v3")
DTYPES = ("fp32", "bf16")
FIRST_LOSS_TOL = {"fp32": 1e-5, "bf16": 1e-3}
KERNEL_TOL = 1e-3  # fp32 max abs error of a device kernel vs the CPU reference
FP8_EXECUTORS = ("scaled_mm", "transformer_engine", "emulated")
FP8_FIRST_LOSS_RTOL = 0.05  # FP8 first loss vs the bf16 run of the same model


@dataclass
class Result:
    check: str
    status: str  # PASS, FAIL or SKIP
    detail: str


# ---- pure logic (unit-tested on the CPU) -----------------------------------------------------------------------
def read_losses(log_dir: Path) -> list[float]:
    """Losses by iteration from <log_dir>/metrics.jsonl; ValueError when the file is missing or has no rows."""
    path = Path(log_dir) / "metrics.jsonl"
    if not path.is_file():
        raise ValueError(f"no metrics.jsonl in {log_dir}")
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    rows = [r for r in rows if "loss" in r and "iteration" in r]
    if not rows:
        raise ValueError(f"{path} has no rows with iteration and loss")
    return [float(r["loss"]) for r in sorted(rows, key=lambda r: r["iteration"])]


def loss_falls(losses: list[float]) -> tuple[bool, str]:
    """Finite losses whose mean over the last (up to) 3 iterations is below the first."""
    if len(losses) < 2:
        return False, f"need >= 2 iterations, got {len(losses)}"
    if not all(math.isfinite(x) for x in losses):
        return False, f"non-finite loss in {losses}"
    tail = losses[-min(3, len(losses) - 1):]
    end = sum(tail) / len(tail)
    return end < losses[0], f"first {losses[0]:.5f} -> last {end:.5f}"


def close(a: float, b: float, tol: float, relative: bool = False) -> tuple[bool, str]:
    diff = abs(a - b) / (abs(b) if relative else 1.0)
    ok = math.isfinite(diff) and diff <= tol
    return ok, f"{a:.7f} vs {b:.7f}: {'rel ' if relative else ''}diff {diff:.2e} (tol {tol:g})"


def parse_kernel_table(output: str) -> tuple[bool | None, dict[str, float]]:
    """(native, {op: max abs err}) from scripts/gpu_kernels.py's output."""
    native = re.search(r"native=(True|False)", output)
    errors = {}
    for line in output.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| ") and len(cells) >= 2 and cells[0] not in ("op", "---"):
            try:
                errors[cells[0]] = float(cells[1])
            except ValueError:
                continue
    return (native.group(1) == "True") if native else None, errors


def render(results: list[Result]) -> str:
    width = max([len(r.check) for r in results] + [5])
    lines = [f"| {'check':{width}s} | status | detail |", f"|{'-' * (width + 2)}|--------|--------|"]
    lines += [f"| {r.check:{width}s} | {r.status:6s} | {r.detail} |" for r in results]
    failed = sum(r.status == "FAIL" for r in results)
    lines.append(f"{len(results)} checks: {sum(r.status == 'PASS' for r in results)} passed, {failed} failed, "
                 f"{sum(r.status == 'SKIP' for r in results)} skipped")
    return "\n".join(lines)


# ---- running ----------------------------------------------------------------------------------------------------
_LAUNCHER_VARS = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT",
                  "TORCHELASTIC_RUN_ID"}


_CHILD_ENV: dict[str, str] = {}  # what main sets for every child (OMP_NUM_THREADS under --jobs)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pretrain_cmd(backend: str, model: str, dtype: str, iters: int, log_dir: Path, nproc: int = 1,
                 extra: tuple[str, ...] = ()) -> list[str]:
    flags = ["--backend", backend, "--model", model, "--model-size", "tiny", "--mock-data", "--train-iters", str(iters),
             "--log-dir", str(log_dir), "--log-interval", "1", "--seed", "1234",
             "--use-cpu-initialization",  # the weights the cpu backend builds (device init draws others)
             *(["--bf16"] if dtype == "bf16" else []),
             *extra]
    if nproc == 1:
        return [sys.executable, "-m", "mtmegatron.pretrain", *flags]
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--master_port",
            str(free_port()), "-m", "mtmegatron.pretrain", *flags, "--tensor-model-parallel-size", str(nproc),
            "--sequence-parallel"]


def run_pretrain(cmd: list[str], log_dir: Path, timeout: int = 600) -> tuple[list[float] | None, str]:
    """(losses, '') or (None, why it failed)."""
    log_dir.mkdir(parents=True, exist_ok=True)
    # a launcher's variables inherited from the caller (RANK, MASTER_PORT of a finished job) must not reach the run;
    # a one-process run gets a fresh port of its own
    env = {k: v for k, v in os.environ.items() if k not in _LAUNCHER_VARS}
    env.update(_CHILD_ENV, MASTER_PORT=str(free_port()))
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=log_dir, env=env)
    except subprocess.TimeoutExpired:
        return None, f"timed out after {timeout}s: {' '.join(cmd)}"
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        return None, f"exit {proc.returncode}: {' / '.join(tail)}"
    try:
        return read_losses(log_dir), ""
    except ValueError as e:
        return None, str(e)


def device_count(backend: str) -> int:
    if backend == "cpu":
        return 0
    import torch

    if backend == "musa":
        importlib.import_module("torch_musa")
    return torch.get_device_module(backend).device_count()


def training_runs(args, work: Path, tp2: bool) -> dict[tuple[str, str], tuple[list[str], Path]]:
    """Every training process of the check: (kind, tag) -> (command, log dir); kind is bt, ref, tp2 or fp8."""
    bt, ref = args.backend_under_test, args.reference_backend
    runs = {}
    for model in args.models:
        for dtype in args.dtypes:
            tag = f"{model}/{dtype}"
            runs["bt", tag] = (pretrain_cmd(bt, model, dtype, args.train_iters, work / bt / tag), work / bt / tag)
            d = work / f"{ref}-reference" / tag  # its own folder: with --backend-under-test cpu, bt is ref too
            runs["ref", tag] = (pretrain_cmd(ref, model, dtype, 1, d), d)
            if tp2:
                d = work / bt / "tp2" / tag
                runs["tp2", tag] = (pretrain_cmd(bt, model, dtype, 1, d, nproc=2), d)
    if not args.skip_fp8:
        for executor in args.fp8_executors:
            if executor_importable(executor):
                d = work / bt / "fp8" / executor
                extra = ("--fp8-format", "e4m3", "--fp8-recipe", "tensorwise", "--fp8-executor", executor)
                runs["fp8", executor] = (pretrain_cmd(bt, args.models[0], "bf16", args.train_iters, d, extra=extra), d)
    return runs


def run_all(runs: dict, jobs: int, timeout: int) -> dict:
    """(kind, tag) -> (losses or None, why it failed), ``jobs`` processes at a time."""
    with ThreadPoolExecutor(max(1, jobs)) as pool:
        futures = {key: pool.submit(run_pretrain, cmd, log_dir, timeout=timeout)
                   for key, (cmd, log_dir) in runs.items()}
        return {key: f.result() for key, f in futures.items()}


def check_training(args, done: dict, tp2: bool) -> tuple[list[Result], dict]:
    results, first = [], {}
    bt, ref = args.backend_under_test, args.reference_backend
    for model in args.models:
        for dtype in args.dtypes:
            tag = f"{model}/{dtype}"
            losses, err = done["bt", tag]
            if losses is None:
                results.append(Result(f"train {tag} on {bt}", "FAIL", err))
                continue
            ok, detail = loss_falls(losses)
            results.append(Result(f"train {tag} on {bt}: loss falls", "PASS" if ok else "FAIL", detail))
            first[tag] = losses[0]
            ref_losses, err = done["ref", tag]
            if ref_losses is None:
                results.append(Result(f"{tag} first loss vs {ref}", "FAIL", f"{ref} run failed: {err}"))
            else:
                ok, detail = close(losses[0], ref_losses[0], FIRST_LOSS_TOL[dtype])
                results.append(Result(f"{tag} first loss {bt} vs {ref}", "PASS" if ok else "FAIL", detail))
            if not tp2:
                continue
            tp_losses, err = done["tp2", tag]
            if tp_losses is None:
                results.append(Result(f"{tag} TP2 on {bt}", "FAIL", err))
            else:
                ok, detail = close(tp_losses[0], losses[0], FIRST_LOSS_TOL[dtype])
                results.append(Result(f"{tag} first loss TP2 vs 1 rank", "PASS" if ok else "FAIL", detail))
    if not tp2:
        results.append(Result("2-rank TP2 runs", "SKIP", f"fewer than 2 {bt} devices (or --tp2 off)"))
    return results, first


def check_kernels(args) -> list[Result]:
    cmd = [sys.executable, str(ROOT / "scripts/gpu_kernels.py"), "--device", args.backend_under_test, "--dtype", "float32"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1200)
    if proc.returncode != 0:
        return [Result("kernels vs CPU reference", "FAIL", f"gpu_kernels.py exit {proc.returncode}: "
                       + " / ".join(proc.stderr.strip().splitlines()[-2:]))]
    native, errors = parse_kernel_table(proc.stdout)
    results = [Result("native kernels registered", "PASS" if native else "FAIL", f"native={native}")]
    if not errors:
        results.append(Result("kernels vs CPU reference", "FAIL", "no rows in gpu_kernels.py output"))
    for op, err in errors.items():
        results.append(Result(f"kernel {op} fp32", "PASS" if err <= KERNEL_TOL else "FAIL",
                              f"max abs err {err:.3g} (tol {KERNEL_TOL:g})"))
    return results


def executor_importable(executor: str) -> bool:
    if executor == "transformer_engine":
        return importlib.util.find_spec("transformer_engine") is not None
    if executor == "scaled_mm":
        import torch

        return hasattr(torch, "_scaled_mm")
    return True


def check_fp8(args, done: dict, first: dict) -> list[Result]:
    results = []
    model = args.models[0]
    for executor in args.fp8_executors:
        if ("fp8", executor) not in done:
            results.append(Result(f"fp8 {executor}", "SKIP", "does not import here"))
            continue
        losses, err = done["fp8", executor]
        if losses is None:
            results.append(Result(f"fp8 {executor} {model}", "FAIL", err))
            continue
        ok, detail = loss_falls(losses)
        results.append(Result(f"fp8 {executor} {model}: loss falls", "PASS" if ok else "FAIL", detail))
        if f"{model}/bf16" in first:
            ok, detail = close(losses[0], first[f"{model}/bf16"], FP8_FIRST_LOSS_RTOL, relative=True)
            results.append(Result(f"fp8 {executor} first loss vs bf16", "PASS" if ok else "FAIL", detail))
    return results


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend-under-test", default="cuda", help="cuda, musa, or cpu (tests this script itself)")
    p.add_argument("--reference-backend", default="cpu")
    p.add_argument("--models", default=",".join(MODELS), type=lambda s: [m for m in s.split(",") if m])
    p.add_argument("--dtypes", default=",".join(DTYPES), type=lambda s: [d for d in s.split(",") if d])
    p.add_argument("--train-iters", type=int, default=20)
    p.add_argument("--tp2", choices=("auto", "on", "off"), default="auto")
    p.add_argument("--skip-kernels", action="store_true")
    p.add_argument("--skip-fp8", action="store_true")
    p.add_argument("--fp8-executors", default=",".join(FP8_EXECUTORS), type=lambda s: [e for e in s.split(",") if e],
                   help="which FP8 executors to train with (torch._scaled_mm on cpu is a slow reference: ~5 min a "
                        "step of the tiny model)")
    p.add_argument("--work-dir", default=None, help="where run logs go (default: a temporary directory)")
    p.add_argument("--jobs", type=int, default=1, help="training processes at a time")
    p.add_argument("--run-timeout", type=int, default=600, help="seconds one training process may take")
    p.add_argument("--json", default=None, help="also write the checks and every run's losses to this file")
    args = p.parse_args(argv)
    bad = ([d for d in args.dtypes if d not in DTYPES] + [m for m in args.models if m not in MODELS]
           + [e for e in args.fp8_executors if e not in FP8_EXECUTORS])
    if bad:
        p.error(f"unknown model/dtype/executor {bad} (models {MODELS}, dtypes {DTYPES}, executors {FP8_EXECUTORS})")
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="mtm-gpu-train-check-"))
    print(f"gpu_train_check: {args.backend_under_test} vs {args.reference_backend}, logs in {work}", flush=True)
    if args.jobs > 1 and "OMP_NUM_THREADS" not in os.environ:
        _CHILD_ENV["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // args.jobs))
    tp2 = args.tp2 == "on" or (args.tp2 == "auto" and device_count(args.backend_under_test) >= 2)
    runs = training_runs(args, work, tp2)
    done = run_all(runs, args.jobs, args.run_timeout)

    def save(results: list[Result]) -> None:  # after each part: a run stopped by a time limit keeps what it found
        if args.json:
            Path(args.json).write_text(json.dumps({
                "backend_under_test": args.backend_under_test, "reference_backend": args.reference_backend,
                "train_iters": args.train_iters, "tp2": tp2, "results": [asdict(r) for r in results],
                "losses": {f"{kind} {tag}": losses for (kind, tag), (losses, _) in done.items()}}, indent=1))

    results, first = check_training(args, done, tp2)
    if not args.skip_fp8:
        results += check_fp8(args, done, first)
    save(results)
    if not args.skip_kernels:
        results += check_kernels(args)
        save(results)
    print(render(results), flush=True)
    return 1 if any(r.status == "FAIL" for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
