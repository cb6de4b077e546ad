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


def _exported(extra_env=None):
    script = (f"source {ROOT / 'examples/common.sh'}; export_musa_defaults || exit 3; "
              "for v in MUSA_KERNEL_TIMEOUT CUDA_DEVICE_MAX_CONNECTIONS OMP_NUM_THREADS MCCL_PROTOS MCCL_IB_GID_INDEX"
              " MCCL_ALGOS; do echo \"$v=${!v:-unset}\"; done")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("MUSA_", "MCCL_", "CUDA_DEVICE_MAX", "OMP_", "MTMEGATRON_MCCL"))}
    proc = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env={**env, **(extra_env or {})})
    return proc.returncode, dict(line.split("=", 1) for line in proc.stdout.split()), proc.stderr


def test_musa_defaults_are_exported_and_user_values_win():
    rc, out, err = _exported()
    assert rc == 0, err
    assert out == {"MUSA_KERNEL_TIMEOUT": "3200000", "CUDA_DEVICE_MAX_CONNECTIONS": "1", "OMP_NUM_THREADS": "4",
                   "MCCL_PROTOS": "unset", "MCCL_IB_GID_INDEX": "unset", "MCCL_ALGOS": "unset"}
    rc, out, err = _exported({"MTMEGATRON_MCCL_CLUSTER_PROFILE": "mt-deepseek", "MCCL_PROTOS": "0"})
    assert rc == 0, err
    assert out["MCCL_IB_GID_INDEX"] == "3" and out["MCCL_ALGOS"] == "1"  # the opt-in cluster profile
    assert out["MCCL_PROTOS"] == "0"  # an exported value wins
    rc, out, err = _exported({"MTMEGATRON_MCCL_CLUSTER_PROFILE": "nope"})
    assert rc == 3 and "'nope' is not a known MCCL cluster profile" in err and "Traceback" not in err
