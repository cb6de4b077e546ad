"""The planner against the simulated MUSA device: ``python benchmarks/plan_validation.py [--only NAME ...] [--markdown]``.

For each configuration (a ~58M-parameter Llama in bf16, sequence 512, or a tiny Mixtral / DeepSeek-V3 at tens of
millions of parameters; FSDP2 / Megatron-FSDP, the precision-aware optimizer, activation offloading and FP8 on our
emulated executor among them; 2 ranks, 2 iterations, ``--log-memory-interval 1``) it runs ``pretrain`` once under
``torchrun`` on the simulated MUSA device (scripts/musa_sim.sh: every device byte is counted by the simulator's
allocator), reads each printing rank's largest "max allocated" (Megatron-LM's memory line, printed by every rank
of data-parallel rank 0 after each iteration), runs ``mtmegatron plan`` in this process on the same command line,
and prints one table: config | rank | measured | ours | err% | Megatron-LM formula | its err% (MiB; err = predicted
/ measured - 1, so negative = predicted too low). A rank's prediction is its pipeline stage's row; Megatron-LM's
formula is one number for the most loaded rank. Configurations run one at a time (a 2-core box: ~20-60 s each).
May assume: run from the repository with torch and torchada installed (the simulator builds itself on first use).
"""

from __future__ import annotations

import argparse
import os
import pathlib
import re
import socket
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
MIB = 2**20
# the environment the runs get, taken before any plan: parsing a command line in this process sets the attention
# backend's NVTE_* variables (config/), which a later run's own parse would then refuse
RUN_ENV = {k: v for k, v in os.environ.items() if k not in ("MUSA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES")}

COMMON = ["--backend", "musa", "--lr", "3e-4", "--lr-decay-style", "constant", "--mock-data", "--hidden-dropout", "0",
          "--attention-dropout", "0", "--log-interval", "1", "--num-workers", "0", "--train-iters", "2",
          "--use-cpu-initialization", "--log-memory-interval", "1", "--bf16"]
LLAMA = ["--model", "llama3", "--num-layers", "8", "--hidden-size", "512", "--num-attention-heads", "8",
         "--num-query-groups", "4", "--ffn-hidden-size", "1536", "--seq-length", "512", "--max-position-embeddings",
         "512", "--vocab-size", "32000", "--untie-embeddings-and-output-weights", "--micro-batch-size", "2",
         "--global-batch-size", "4", *COMMON]
MIXTRAL = ["--model", "mixtral", "--num-layers", "4", "--hidden-size", "512", "--num-attention-heads", "8",
           "--num-query-groups", "4", "--ffn-hidden-size", "1024", "--num-experts", "4", "--moe-router-topk", "2",
           "--seq-length", "512", "--max-position-embeddings", "512", "--vocab-size", "32000",
           "--untie-embeddings-and-output-weights", "--micro-batch-size", "2", "--global-batch-size", "4", *COMMON]
DEEPSEEK = ["--model", "deepseek-v3", "--model-size", "tiny", "--seq-length", "512", "--max-position-embeddings",
            "512", "--micro-batch-size", "2", "--global-batch-size", "4", *COMMON]
TP2_SP = ["--tensor-model-parallel-size", "2", "--sequence-parallel"]
DIST = ["--use-distributed-optimizer"]
LOCAL = ["--attention-backend", "local"]

# name -> the pretrain command line after --backend musa (2 ranks each)
CONFIGS: dict[str, list[str]] = {
    "dense TP2+SP, dist-opt, selective, local attn": [*LLAMA, *LOCAL, *TP2_SP, *DIST, "--recompute-activations"],
    "dense TP2+SP, dist-opt, selective, SDPA": [*LLAMA, *TP2_SP, *DIST, "--recompute-activations"],
    "dense TP2+SP, dist-opt, no recompute": [*LLAMA, *LOCAL, *TP2_SP, *DIST],
    "dense TP2 (no SP), full recompute": [*LLAMA, "--tensor-model-parallel-size", "2", "--recompute-granularity",
                                          "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"],
    "dense DP2, dist-opt": [*LLAMA, *DIST],
    "dense DP2, dist-opt, optimizer CPU offload 0.5": [*LLAMA, *DIST, "--optimizer-cpu-offload", "--use-precision-aware-optimizer",
                                                       "--optimizer-offload-fraction", "0.5"],
    "dense PP2": [*LLAMA, "--pipeline-model-parallel-size", "2"],
    "dense PP2 VPP2": [*LLAMA, "--pipeline-model-parallel-size", "2", "--num-layers-per-virtual-pipeline-stage", "2"],
    "dense CP2, full recompute": [*LLAMA, "--context-parallel-size", "2", "--recompute-granularity", "full",
                                  "--recompute-method", "uniform", "--recompute-num-layers", "1"],
    "dense DP2, torch FSDP2": [*LLAMA, "--use-torch-fsdp2", "--ckpt-format", "torch_dist"],
    "dense DP2, Megatron-FSDP optim_grads_params": [*LLAMA, *DIST, "--use-megatron-fsdp",
                                                    "--data-parallel-sharding-strategy", "optim_grads_params"],
    "dense DP2, Megatron-FSDP optim": [*LLAMA, *DIST, "--use-megatron-fsdp", "--data-parallel-sharding-strategy",
                                       "optim"],
    "dense DP2, dist-opt, precision-aware bf16 moments and grads": [
        *LLAMA, *DIST, "--use-precision-aware-optimizer", "--exp-avg-dtype", "bf16", "--exp-avg-sq-dtype", "bf16",
        "--main-grads-dtype", "bf16"],
    "dense DP2, dist-opt, activation offload core_attn": [*LLAMA, *DIST, "--fine-grained-activation-offloading",
                                                          "--offload-modules", "core_attn"],
    "dense TP2+SP, dist-opt, FP8 tensorwise (emulated)": [*LLAMA, *TP2_SP, *DIST, "--fp8-format", "e4m3",
                                                          "--fp8-recipe", "tensorwise"],
    "Mixtral MoE EP2": [*MIXTRAL, "--expert-model-parallel-size", "2"],
    "Mixtral MoE TP2+SP EP2, dist-opt": [*MIXTRAL, *TP2_SP, "--expert-model-parallel-size", "2",
                                         "--expert-tensor-parallel-size", "1", *DIST],
    "DeepSeek-V3 tiny MLA+MoE EP2": [*DEEPSEEK, "--expert-model-parallel-size", "2"],
}

MEMORY_LINE = re.compile(r"\[Rank (\d+)\] \(after \d+ iterations\) memory \(MB\) \| allocated: [\d.]+ "
                         r"\| max allocated: ([\d.]+)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure(argv: list[str], log_dir: str, timeout: float) -> dict[int, float]:
    """Each printing rank's largest "max allocated" (bytes) over the run's iterations on the simulated device."""
    env = {"OMP_NUM_THREADS": "1", **RUN_ENV}
    cmd = ["bash", str(REPO / "scripts" / "musa_sim.sh"), sys.executable, "-m", "torch.distributed.run",
           "--nproc_per_node=2", f"--master_port={_free_port()}", "-m", "mtmegatron.pretrain",
           *argv, "--log-dir", log_dir]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd=REPO)
    if done.returncode != 0:  # the ranks' own errors, not only the launcher's summary
        errors = [line for line in done.stderr.splitlines() if re.search(r"Error|error:", line)]
        raise RuntimeError(f"pretrain failed ({done.returncode}):\n" + "\n".join(errors[:20]))
    peaks: dict[int, float] = {}
    for rank, mib in MEMORY_LINE.findall(done.stdout):
        peaks[int(rank)] = max(peaks.get(int(rank), 0.0), float(mib) * MIB)
    if not peaks:
        raise RuntimeError(f"no memory line in the run's output:\n{done.stdout[-2000:]}")
    return peaks


def predict(argv: list[str], log_dir: str) -> dict:
    from mtmegatron.plan.command import plan

    saved = dict(os.environ)
    try:
        return plan(["--world-size", "2", *argv, "--log-dir", log_dir])
    finally:  # each command line's parse starts from the same environment, as each run's does
        os.environ.clear()
        os.environ.update(saved)


def stage_row(result: dict, rank: int) -> dict:
    """The planner row of the pipeline stage ``rank`` belongs to (ranks are numbered TP, CP, DP, then PP)."""
    lay = result["layout"]
    per_stage = result["world_size"] // lay["pp"]
    return next(r for r in result["ranks"] if r["stage"] == rank // per_stage)


def rows_for(name: str, argv: list[str], timeout: float) -> list[tuple]:
    with tempfile.TemporaryDirectory() as tmp:
        result = predict(argv, str(pathlib.Path(tmp) / "plan"))
        t0 = time.perf_counter()
        peaks = measure(argv, str(pathlib.Path(tmp) / "run"), timeout)
        seconds = time.perf_counter() - t0
    formula = result["megatron_lm_formula_bytes"]["total"]
    return [(name, rank, measured, stage_row(result, rank)["peak_bytes"], formula, seconds)
            for rank, measured in sorted(peaks.items())]


def render(rows: list[tuple], markdown: bool) -> str:
    head = ("config", "rank", "measured MiB", "ours MiB", "err%", "Megatron-LM MiB", "its err%")
    out = []
    if markdown:
        out += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    else:
        out.append(f"{head[0]:<48s} {head[1]:>4s} {head[2]:>12s} {head[3]:>9s} {head[4]:>7s} {head[5]:>15s} "
                   f"{head[6]:>8s}")
    for name, rank, measured, ours, formula, _ in rows:
        cells = (name, str(rank), f"{measured / MIB:.1f}", f"{ours / MIB:.1f}", f"{(ours / measured - 1) * 100:+.1f}",
                 f"{formula / MIB:.1f}", f"{(formula / measured - 1) * 100:+.1f}")
        out.append("| " + " | ".join(cells) + " |" if markdown else
                   f"{cells[0]:<48s} {cells[1]:>4s} {cells[2]:>12s} {cells[3]:>9s} {cells[4]:>7s} {cells[5]:>15s} "
                   f"{cells[6]:>8s}")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", nargs="*", default=None, help="substrings of the configuration names to run")
    p.add_argument("--markdown", action="store_true", help="a Markdown table (docs/memory.md)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per run")
    opts = p.parse_args(argv)
    rows = []
    for name, cfg in CONFIGS.items():
        if opts.only and not any(s in name for s in opts.only):
            continue
        try:
            got = rows_for(name, cfg, opts.timeout)
        except Exception as e:  # one failing configuration is reported, the others still run
            print(f"{name}: failed: {str(e)[-1500:]}", file=sys.stderr, flush=True)
            continue
        rows += got
        print(render(got, False), f"({got[0][5]:.0f} s)", flush=True)
    within = {r[0] for r in rows} - {r[0] for r in rows if abs(r[3] / r[2] - 1) > 0.10}
    print("\n" + render(rows, opts.markdown))
    print(f"\n{len(within)} of {len({r[0] for r in rows})} configurations within 10% on every rank", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
