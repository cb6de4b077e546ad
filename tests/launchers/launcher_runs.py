"""Shared by tests/launchers: how the tests start a launcher (tiny, fp32, CPU) and read its losses.

May assume: the tests run from the repository's tests/ directory layout (helpers importable), Linux (/proc).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = "examples/llama3/dist_run_pretrain_megatron_llama3_musa.sh"
LOCAL_SHELL = str(Path(__file__).with_name("local_shell.sh"))  # a REMOTE_SHELL that runs the command here
ITERS = 4  # the loss falls by ~0.4 in 4 iterations of the tiny Llama-3 (warm-up 2)
ARGS = ["--backend", "cpu", "--train-iters", str(ITERS), "--eval-iters", "0", "--num-samples", "0"]
HOSTFILE = "# two nodes on one machine\n127.0.0.1 slots=1\nlocalhost   slots=1  # the second\n"
_CLEARED = ("LOG_DIR", "DATA_PATH", "HF_DIR", "HOSTFILE", "REMOTE_SHELL", "NNODES", "NODE_RANK", "MASTER_ADDR",
            "MASTER_PORT", "NPROC_PER_NODE", "RDZV_ID", "RDZV_ENDPOINT", "MTMEGATRON_RUN_ID", "BACKEND")


def launch_env(**extra: str) -> dict:
    """The test process's environment without any launch or Slurm variable, one thread per rank, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if k not in _CLEARED and not k.startswith("SLURM_")}
    return {**env, "OMP_NUM_THREADS": "1", **extra}


def start(cwd: Path, env: dict, args=ARGS, script: str = SCRIPT) -> subprocess.Popen:
    return subprocess.Popen(["bash", str(ROOT / script), *args], cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def losses(cwd: Path, script: str = SCRIPT) -> list[float]:
    rows = (cwd / "runs" / Path(script).stem / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line)["loss"] for line in rows]


def run_processes(run_id: str) -> list[psutil.Process]:
    """The processes of this machine whose environment names the run (MTMEGATRON_RUN_ID=<run_id>-node<k>)."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get("MTMEGATRON_RUN_ID", "").startswith(run_id + "-node"):
                found.append(proc)
        except psutil.Error:
            pass
    return found
