"""torch FSDP2 with CPU offload (``--torch-fsdp2-cpu-offload``: torch's CPUOffloadPolicy through megatron-core's
wrapper, patches/torch_fsdp2_cpu_offload.py; the clipping of host gradients, patches/clip_grads_on_host.py).

* cpu backend (host = device): the start-up line says there is nothing to move (the DP2 losses equal DDP + the
  distributed optimizer's within 1e-6 with the flag: tests/parallel/test_fsdp.py's ``torch_fsdp2_cpu_offload``);
* simulated MUSA device, DP2, fp32, ITERS iterations (benchmarks/memory.py's worker, which counts what each rank
  holds on the device and on the host at its optimizer step, benchmarks/state_bytes.py): the same losses as FSDP2
  without the flag (ATOL);
  parameter shards, gradients and optimizer state leave the device (at most 10% of the non-offloaded run's bytes
  stay; measured: 0) and are on the host instead (the same bytes), and the device peak falls;
* bf16 at TP2 x DP2 with sequence parallelism (patches/float16_optimizer_host_params.py: the mixed-precision
  optimizer takes the host shards; patches/tp_grad_sync_host_shards.py: the layer norms' TP all-reduce of host
  shards): the bf16 shards, the fp32 main params and Adam's moments leave the device (measured: 0 of 90,688 +
  544,128 bytes stay on rank 0; 634,924 on the host), peak 1.48 -> 0.75 MB, identical losses (torch's AdamW: see
  TORCH_ADAMW); on the cpu backend bf16 DP2 with offload, saved half way and resumed (training/checkpoint/fsdp_checkpoint.py),
  gives bf16 FSDP2's losses without it (fused Adam in both; measured: identical);
* refused in one line: the flag without FSDP2; Megatron-FSDP with --optimizer-cpu-offload (megatron-core's
  HybridDeviceOptimizer cannot copy Megatron-FSDP's DTensor parameters).
Cost: two two-rank and two four-rank runs on the simulated device, three short two-rank runs on the cpu backend,
one module fixture: measured 122 s and 171 s on 2 cores shared with other jobs (41 s for the fp32 pair alone,
measured earlier; the cpu case in test_fsdp.py adds one run, ~18 s).
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

from helpers.musa_sim import sim_env
from helpers.ports import free_port
from helpers.pretrain_runner import LAUNCHER_VARS, TINY, run_pretrain
from mtmegatron.config.arguments import parse_args
from mtmegatron.utils.errors import ConfigError

ITERS = 4
ATOL = 1e-6
# The bf16 pair on the simulated device steps with torch's AdamW: with mtmegatron's fused adam_step the offloaded
# run steps with the native CPU kernel (FMA, float coefficients) on the host shards and the other with the op's
# Python reference on the device (the simulator has no native kernel); their fp32 results differ in the last bit,
# which bf16 rounds one ulp apart on some weights (measured max loss diff: 4.05e-5 at DP2, 4.5e-4 at TP2 x DP2 + SP,
# 4 iterations); with torch's AdamW on both: identical losses. (The cpu pair steps with the fused kernel on both.)
TORCH_ADAMW = {"MTMEGATRON_DISABLE_PATCHES": "optimizer_fused_adam"}
TP2_SP = ["--bf16", "--tensor-model-parallel-size", "2", "--sequence-parallel"]
FSDP2 = ["--use-torch-fsdp2", "--untie-embeddings-and-output-weights", "--train-iters", str(ITERS)]
OFFLOAD = ["--torch-fsdp2-cpu-offload"]
BENCHMARK = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "memory.py"
STATE = ("parameters", "gradients", "optimizer")


def _max_diff(a: list[float], b: list[float]) -> float:
    assert len(a) == len(b) == ITERS, (a, b)
    return max(abs(x - y) for x, y in zip(a, b))


def _sim_worker(out: pathlib.Path, extra: list[str], backend: str = "musa", nproc: int = 2,
                env_extra: dict | None = None) -> dict:
    """benchmarks/memory.py's worker on the simulated device (or the cpu backend): rank 0's numbers."""
    args = [a for a in TINY if a not in ("--backend", "cpu")] + ["--backend", backend] + FSDP2 + extra
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", f"--master_port={free_port()}",
           str(BENCHMARK), "--worker", "--out", str(out), "--iters", str(ITERS), "--warmup", "1", *args]
    env = sim_env(env_extra) if backend == "musa" else {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS}
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0 and out.exists(), f"{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    return json.loads(out.read_text())


def _saved_and_resumed(root: pathlib.Path, extra: list[str]) -> list[float]:
    """pretrain on the cpu backend, DP2: ITERS // 2 iterations saved, then resumed to ITERS (constant lr: the
    schedule of the resumed run is the uninterrupted one's); the losses of both halves."""
    half, ckpt = ITERS // 2, root / "ckpt"
    flags = [f for f in FSDP2 if f not in ("--train-iters", str(ITERS))] + extra
    _, first = run_pretrain(2, TINY + flags + ["--train-iters", str(half), "--save", str(ckpt), "--save-interval",
                                               str(half)], root / "saved")
    _, second = run_pretrain(2, TINY + flags + ["--train-iters", str(ITERS), "--load", str(ckpt),
                                                "--override-opt_param-scheduler"], root / "resumed")
    return [r["loss"] for r in first + second]


@pytest.fixture(scope="module")
def sim_runs(tmp_path_factory):
    """(name -> rank 0's numbers), each configuration with and without offload: fp32 DP2 and bf16 TP2 x DP2 with
    sequence parallelism (torch's AdamW, TORCH_ADAMW) on the simulated device, bf16 DP2 on the cpu backend."""
    root = tmp_path_factory.mktemp("fsdp2_offload_sim")
    runs = {"plain": ([], "musa", 2, None), "offload": (OFFLOAD, "musa", 2, None),
            "sim_bf16_sp": (TP2_SP, "musa", 4, TORCH_ADAMW),
            "sim_bf16_sp_offload": (TP2_SP + OFFLOAD, "musa", 4, TORCH_ADAMW),
            "cpu_bf16": (["--bf16"], "cpu", 2, None)}
    found = {name: _sim_worker(root / f"{name}.json", *spec) for name, spec in runs.items()}
    found["cpu_bf16_offload_resumed"] = {"losses": _saved_and_resumed(root / "cpu_bf16_offload", ["--bf16"] + OFFLOAD)}
    return found


@pytest.mark.musa_sim
def test_simulated_device_state_leaves_the_device_with_the_same_losses(sim_runs):
    plain, offload = sim_runs["plain"], sim_runs["offload"]
    assert _max_diff(plain["losses"], offload["losses"]) <= ATOL, (plain["losses"], offload["losses"])
    for component in STATE:
        assert plain[f"{component}_bytes"] > 0, plain
        assert offload[f"{component}_bytes"] <= 0.1 * plain[f"{component}_bytes"], (component, offload, plain)
    # what left the device is on the host, byte for byte
    assert offload["host_bytes"] >= sum(plain[f"{c}_bytes"] for c in STATE), (offload, plain)
    assert offload["peak_device_bytes"] < plain["peak_device_bytes"], (offload, plain)


@pytest.mark.musa_sim
def test_bf16_sequence_parallel_state_lives_on_the_host_with_the_same_losses(sim_runs):
    """bf16 (patches/float16_optimizer_host_params.py) at TP2 x DP2 with sequence parallelism (the layer norms'
    TP all-reduce of host shards: patches/tp_grad_sync_host_shards.py): the bf16 shards, the optimizer's fp32 main
    copies and Adam's moments leave the device (the model's bf16 gradients are freed once copied to the fp32 main
    grads, in both runs, so the non-offloaded run holds no gradient bytes at the step either)."""
    plain, offload = sim_runs["sim_bf16_sp"], sim_runs["sim_bf16_sp_offload"]
    assert _max_diff(plain["losses"], offload["losses"]) <= ATOL, (plain["losses"], offload["losses"])
    assert plain["parameters_bytes"] > 0 and plain["optimizer_bytes"] > 0, plain
    for component in STATE:
        assert offload[f"{component}_bytes"] <= 0.1 * plain[f"{component}_bytes"], (component, offload, plain)
    assert offload["host_bytes"] >= sum(plain[f"{c}_bytes"] for c in STATE), (offload, plain)
    assert offload["peak_device_bytes"] < plain["peak_device_bytes"], (offload, plain)


@pytest.mark.musa_sim
def test_cpu_backend_bf16_offload_saved_and_resumed_equals_bf16_fsdp2(sim_runs):
    """Host to host, both step with the same CPU adam_step kernel; the offloaded run saved half way and resumed
    (training/checkpoint/fsdp_checkpoint.py: the mixed-precision optimizer's state): the same losses (measured: identical)."""
    plain, offload = sim_runs["cpu_bf16"]["losses"], sim_runs["cpu_bf16_offload_resumed"]["losses"]
    assert _max_diff(plain, offload) <= ATOL, (plain, offload)


def test_cpu_backend_says_it_has_nothing_to_move():
    args = parse_args(TINY + FSDP2 + OFFLOAD, world_size=2)
    assert args.fsdp_offload_note.startswith("--torch-fsdp2-cpu-offload: nothing to move on the cpu backend"), \
        args.fsdp_offload_note


@pytest.mark.parametrize("extra, says", [
    (OFFLOAD, "--torch-fsdp2-cpu-offload needs --use-torch-fsdp2"),
    (["--use-megatron-fsdp", "--use-distributed-optimizer", "--use-precision-aware-optimizer",
      "--optimizer-cpu-offload"], "--use-megatron-fsdp: --optimizer-cpu-offload: megatron-core 0.16.1's "
                                  "HybridDeviceOptimizer"),
])
def test_refused_in_one_line(extra, says):
    with pytest.raises(ConfigError) as e:
        parse_args(TINY + ["--train-iters", "1"] + extra, world_size=2)
    assert str(e.value).startswith(says) and "\n" not in str(e.value), str(e.value)
