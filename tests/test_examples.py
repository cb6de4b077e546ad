"""The example launchers run as documented: defaults train, extra flags override, MUSA defaults exported."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from helpers.pretrain_runner import free_port

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("script", [
    "examples/llama3/dist_run_pretrain_megatron_llama3_musa.sh",
    "examples/mixtral/dist_run_pretrain_megatron_mixtral_musa.sh",
])
def test_example_runs_on_cpu_with_passthrough_flags(script, tmp_path):
    env = {**os.environ, "MASTER_PORT": str(free_port()), "LOG_DIR": str(tmp_path)}
    proc = subprocess.run(["bash", str(ROOT / script), "--backend", "cpu", "--train-iters", "4"],
                          capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in rows] == [1, 2, 3, 4]  # --train-iters 4 overrode the default 30
    for row in rows:  # the metrics contract other tools rely on
        assert {"iteration", "loss", "grad_norm", "lr", "tokens_per_sec"} <= row.keys()
        assert row["loss"] > 0 and row["grad_norm"] > 0 and row["lr"] >= 0 and row["tokens_per_sec"] > 0
    assert rows[0]["lr"] < rows[-1]["lr"]  # the examples warm the learning rate up
    assert "iteration      4/     4" in proc.stdout  # console progress


def test_musa_defaults_are_exported_and_user_values_win():
    script = (f"source {ROOT / 'examples/common.sh'}; export_musa_defaults; "
              "echo $MUSA_KERNEL_TIMEOUT $MCCL_PROTOS $MCCL_BUFFSIZE $CUDA_DEVICE_MAX_CONNECTIONS $MCCL_ALGOS")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MUSA_", "MCCL_", "CUDA_DEVICE_MAX"))}
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env, check=True).stdout.split()
    assert out == ["3200000", "2", "20480000", "1", "1"]
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True,
                         env={**env, "MCCL_PROTOS": "0"}).stdout.split()
    assert out[1] == "0"
