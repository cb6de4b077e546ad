"""torch FSDP2 with CPU offload (``--torch-fsdp2-cpu-offload``: torch's CPUOffloadPolicy through megatron-core's
wrapper, patches/torch_fsdp2_cpu_offload.py; the clipping of host gradients, patches/clip_grads_on_host.py).

* cpu backend (host = device): the start-up line says there is nothing to move (the DP2 losses equal DDP + the
  distributed optimizer's within 1e-6 with the flag: tests/parallel/test_fsdp.py's ``torch_fsdp2_cpu_offload``);
* simulated MUSA device, DP2, fp32, ITERS iterations (benchmarks/memory.py's worker, which counts what each rank
  holds on the device and on the host at its optimizer step, benchmarks/state_bytes.py): the same losses as FSDP2
  without the flag (ATOL);
  parameter shards, gradients and optimizer state leave the device (at most 10% of the non-offloaded run's bytes
  stay; measured: 0) and are on the host instead (the same bytes), and the device peak falls;
* refused in one line: the flag without FSDP2; with --bf16 (megatron-core's mixed-precision optimizer takes device
  parameters only: a TypeError at start-up on the simulated device); with sequence parallelism at TP > 1 (megatron-core
  gathers the layer norms' host gradients for a TP all-reduce, which MCCL refuses; TP2 x DP2 without SP ran on the
  simulated device with FSDP2's losses, by hand); Megatron-FSDP with --optimizer-cpu-offload (megatron-core's
  HybridDeviceOptimizer cannot copy Megatron-FSDP's DTensor parameters).
Cost: two two-rank runs on the simulated device, measured 41 s on 2 shared cores (the cpu case in test_fsdp.py adds
one run, ~18 s).
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

from helpers.musa_sim import sim_env
from helpers.ports import free_port
from helpers.pretrain_runner import TINY
from mtmegatron.training.arguments import parse_args
from mtmegatron.utils.errors import ConfigError

ITERS = 4
ATOL = 1e-6
FSDP2 = ["--use-torch-fsdp2", "--untie-embeddings-and-output-weights", "--train-iters", str(ITERS)]
OFFLOAD = ["--torch-fsdp2-cpu-offload"]
BENCHMARK = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "memory.py"
STATE = ("parameters", "gradients", "optimizer")


def _max_diff(a: list[float], b: list[float]) -> float:
    assert len(a) == len(b) == ITERS, (a, b)
    return max(abs(x - y) for x, y in zip(a, b))


def _sim_worker(out: pathlib.Path, extra: list[str]) -> dict:
    """benchmarks/memory.py's worker on the simulated device, DP2: rank 0's numbers."""
    args = [a for a in TINY if a not in ("--backend", "cpu")] + ["--backend", "musa"] + FSDP2 + extra
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={free_port()}",
           str(BENCHMARK), "--worker", "--out", str(out), "--iters", str(ITERS), "--warmup", "1", *args]
    done = subprocess.run(cmd, env=sim_env(), capture_output=True, text=True, timeout=400)
    assert done.returncode == 0 and out.exists(), f"{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def sim_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("fsdp2_offload_sim")
    return _sim_worker(root / "plain.json", []), _sim_worker(root / "offload.json", OFFLOAD)


@pytest.mark.musa_sim
def test_simulated_device_state_leaves_the_device_with_the_same_losses(sim_runs):
    plain, offload = sim_runs
    assert _max_diff(plain["losses"], offload["losses"]) <= ATOL, (plain["losses"], offload["losses"])
    for component in STATE:
        assert plain[f"{component}_bytes"] > 0, plain
        assert offload[f"{component}_bytes"] <= 0.1 * plain[f"{component}_bytes"], (component, offload, plain)
    # what left the device is on the host, byte for byte
    assert offload["host_bytes"] >= sum(plain[f"{c}_bytes"] for c in STATE), (offload, plain)
    assert offload["peak_device_bytes"] < plain["peak_device_bytes"], (offload, plain)


def test_cpu_backend_says_it_has_nothing_to_move():
    args = parse_args(TINY + FSDP2 + OFFLOAD, world_size=2)
    assert args.fsdp_offload_note.startswith("--torch-fsdp2-cpu-offload: nothing to move on the cpu backend"), \
        args.fsdp_offload_note


@pytest.mark.parametrize("extra, says", [
    (OFFLOAD, "--torch-fsdp2-cpu-offload needs --use-torch-fsdp2"),
    (FSDP2 + OFFLOAD + ["--bf16"], "--torch-fsdp2-cpu-offload with --bf16: megatron-core 0.16.1's mixed-precision"),
    (FSDP2 + OFFLOAD + ["--tensor-model-parallel-size", "2", "--sequence-parallel"],
     "--torch-fsdp2-cpu-offload with --sequence-parallel (or --qk-layernorm) at TP > 1: megatron-core 0.16.1 gathers"),
    (["--use-megatron-fsdp", "--use-distributed-optimizer", "--use-precision-aware-optimizer",
      "--optimizer-cpu-offload"], "--use-megatron-fsdp: --optimizer-cpu-offload: megatron-core 0.16.1's "
                                  "HybridDeviceOptimizer"),
])
def test_refused_in_one_line(extra, says):
    with pytest.raises(ConfigError) as e:
        parse_args(TINY + ["--train-iters", "1"] + extra, world_size=2)
    assert str(e.value).startswith(says) and "\n" not in str(e.value), str(e.value)
