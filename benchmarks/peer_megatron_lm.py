"""Megatron-LM's row of benchmarks/step.py: Megatron-LM core_v0.16.1's own ``pretrain_gpt.py`` with
``--transformer-impl local`` on the same model, shapes and device as the row it is compared with, one rank, mock
data. ``megatron_lm_flags`` turns the parsed mtmegatron flags of a benchmark model into Megatron-LM's (NullTokenizer
with the same padded vocabulary; every width, GQA, RoPE base, RMSNorm, SwiGLU, untied output, no biases, bf16,
micro/global batch, distributed optimizer, MoE experts/top-k/grouped GEMM); ``run`` starts one process of this
file, which times every ``train_step`` (synchronized) and reports the median after ``warmup`` steps and the peak
memory (the device's max allocated on a GPU, the process's peak RSS on the cpu).

Where Megatron-LM's source comes from (``find_source``): ``--megatron-lm DIR`` / $MTM_MEGATRON_LM (an extracted
tree), .device/peers/megatron-lm (scripts/device_bundle.sh puts it there for the offline GPU machine), else a
``git archive`` of the tag from the bare clone scripts/megatron_lm_host.py names, into a temporary folder.
On the cpu it runs through mtmegatron's host bridge (scripts/megatron_lm_host.py's work-arounds, Megatron-LM's
fusions off as they are in the checkpoint fixtures); on CUDA natively, with Megatron-LM's default fusions.
Usage (as a worker; step.py calls ``run``): python benchmarks/peer_megatron_lm.py MLM_DIR BACKEND WARMUP OUT.json
       -- <pretrain_gpt.py flags>
May assume: megatron-core 0.16.x installed; on cpu, mtmegatron installed.
"""

from __future__ import annotations

import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
BUNDLED = ROOT / ".device/peers/megatron-lm"
CPU_FUSIONS_OFF = ["--no-rope-fusion", "--no-bias-swiglu-fusion", "--no-bias-dropout-fusion",
                   "--no-masked-softmax-fusion", "--no-gradient-accumulation-fusion", "--no-persist-layer-norm",
                   "--no-bias-gelu-fusion"]


def megatron_lm_flags(args, backend: str, train_iters: int) -> list[str]:
    """Megatron-LM's pretrain_gpt.py flags for the model mtmegatron parsed into ``args``."""
    f = ["--num-layers", args.num_layers, "--hidden-size", args.hidden_size, "--ffn-hidden-size",
         args.ffn_hidden_size, "--num-attention-heads", args.num_attention_heads, "--seq-length", args.seq_length,
         "--max-position-embeddings", args.max_position_embeddings, "--kv-channels",
         args.kv_channels or args.hidden_size // args.num_attention_heads,
         "--position-embedding-type", args.position_embedding_type, "--rotary-base", int(args.rotary_base),
         "--normalization", args.normalization, "--norm-epsilon", args.layernorm_epsilon,
         # NullTokenizer has vocab_size + 1 ids; divisible-by 1: the padded vocabulary is exactly ours
         "--tokenizer-type", "NullTokenizer", "--vocab-size", args.padded_vocab_size - 1,
         "--make-vocab-size-divisible-by", "1",
         "--micro-batch-size", args.micro_batch_size, "--global-batch-size", args.global_batch_size,
         "--mock-data", "--train-iters", train_iters, "--lr", args.lr, "--lr-decay-style", "constant",
         "--weight-decay", args.weight_decay, "--adam-beta1", args.adam_beta1, "--adam-beta2", args.adam_beta2,
         "--adam-eps", args.adam_eps, "--clip-grad", args.clip_grad, "--init-method-std", args.init_method_std,
         "--seed", args.seed, "--hidden-dropout", "0", "--attention-dropout", "0",
         "--transformer-impl", "local", "--eval-iters", "0", "--eval-interval", "1000000",
         "--log-interval", "1000000", "--distributed-backend", "gloo" if backend == "cpu" else "nccl"]
    if args.num_query_groups and args.num_query_groups != args.num_attention_heads:
        f += ["--group-query-attention", "--num-query-groups", args.num_query_groups]
    if args.swiglu:
        f.append("--swiglu")
    if args.untie_embeddings_and_output_weights:
        f.append("--untie-embeddings-and-output-weights")
    if not args.add_bias_linear:
        f.append("--disable-bias-linear")
    if args.bf16:
        f.append("--bf16")
    if args.use_distributed_optimizer:
        f.append("--use-distributed-optimizer")
    if args.num_experts:
        f += ["--num-experts", args.num_experts, "--moe-router-topk", args.moe_router_topk,
              "--moe-ffn-hidden-size", args.moe_ffn_hidden_size or args.ffn_hidden_size,
              "--moe-router-load-balancing-type", args.moe_router_load_balancing_type,
              "--moe-aux-loss-coeff", args.moe_aux_loss_coeff, "--moe-token-dispatcher-type",
              args.moe_token_dispatcher_type]
        if args.moe_grouped_gemm:
            f.append("--moe-grouped-gemm")
    if backend == "cpu":
        f += CPU_FUSIONS_OFF
    return [str(x) for x in f]


def find_source(given: str | None) -> tuple[str | None, str]:
    """(an extracted Megatron-LM tree, where it came from) or (None, why there is none)."""
    given = given or os.environ.get("MTM_MEGATRON_LM")
    if given:
        ok = (Path(given) / "pretrain_gpt.py").is_file()
        return (given, given) if ok else (None, f"{given} holds no pretrain_gpt.py")
    if (BUNDLED / "pretrain_gpt.py").is_file():
        return str(BUNDLED), str(BUNDLED)
    from megatron_lm_host import DEFAULT_REPO, TAG, extract_megatron_lm

    if not Path(DEFAULT_REPO).is_dir():
        return None, (f"no Megatron-LM source: neither {BUNDLED} (scripts/device_bundle.sh) nor a clone at "
                      f"{DEFAULT_REPO}")
    into = Path(tempfile.mkdtemp(prefix="mtm-megatron-lm-"))
    extract_megatron_lm(DEFAULT_REPO, into, only_trainer=True)
    return str(into), f"git archive {TAG} of {DEFAULT_REPO}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(mlm: str, backend: str, flags: list[str], warmup: int, threads: int, timeout: int = 1800) -> dict:
    """One Megatron-LM process; {"ms", "peak_gib", "fusions"} or {"error"}."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "peer.json"
        env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
        env.update(OMP_NUM_THREADS=str(threads), CUDA_DEVICE_MAX_CONNECTIONS="1", RANK="0", WORLD_SIZE="1",
                   LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()),
                   PYTHONPATH=os.pathsep.join([mlm, env.get("PYTHONPATH", "")]).rstrip(os.pathsep))
        cmd = [sys.executable, os.path.abspath(__file__), mlm, backend, str(warmup), str(out), "--", *flags]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
        except subprocess.TimeoutExpired:
            return {"error": f"Megatron-LM's pretrain_gpt.py did not finish in {timeout}s"}
        if done.returncode != 0 or not out.is_file():
            lines = [ln for ln in (done.stderr + done.stdout).splitlines() if ln.strip()]
            why = next((ln for ln in reversed(lines) if "Error" in ln), lines[-1] if lines else "?")
            return {"error": f"Megatron-LM's pretrain_gpt.py failed ({done.returncode}): {why.strip()}"}
        result = json.loads(out.read_text())
    steps = result["step_ms"][warmup:]
    if not steps:
        return {"error": f"Megatron-LM ran {len(result['step_ms'])} steps, none after the {warmup} warm-up ones"}
    return {"ms": statistics.median(steps), "peak_gib": result["peak_gib"],
            "fusions": "none (cpu)" if backend == "cpu" else "Megatron-LM defaults"}


def worker(mlm: str, backend: str, warmup: int, out: str, flags: list[str]) -> None:
    from megatron_lm_host import prepare_worker, run_pretrain_gpt

    training = prepare_worker(mlm, backend, __file__)
    import torch

    device = None if backend == "cpu" else torch.get_device_module(backend)
    real_step, step_ms = training.train_step, []

    def train_step(*a, **kw):
        if device is not None:
            device.synchronize()
        start = time.perf_counter()
        result = real_step(*a, **kw)
        if device is not None:
            device.synchronize()
        step_ms.append(1000 * (time.perf_counter() - start))
        if device is not None and len(step_ms) == warmup:
            device.reset_peak_memory_stats()
        return result

    training.train_step = train_step
    try:
        run_pretrain_gpt(mlm, flags)
    finally:
        if device is not None:
            peak = device.max_memory_allocated() / 2 ** 30
        else:
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20  # KiB on Linux
        Path(out).write_text(json.dumps({"step_ms": step_ms, "peak_gib": peak}))


if __name__ == "__main__":
    split = sys.argv.index("--")
    mlm_dir, backend_name, warmup_steps, out_file = sys.argv[1:split]
    worker(mlm_dir, backend_name, int(warmup_steps), out_file, sys.argv[split + 1:])
