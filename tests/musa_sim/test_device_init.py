"""Device-side init on the simulated MUSA device (Megatron-LM's default, models/initialization.py): the weights
are born on ``musa:<LOCAL_RANK>`` with no host copy, ``--seed`` fixes them, and ``--use-cpu-initialization``
gives exactly the cpu backend's weights. One worker run per backend (init_worker.py), shared by the module.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helpers.musa_sim import LAUNCHER_VARS, sim_env
from helpers.pretrain_runner import free_port

pytestmark = pytest.mark.musa_sim

WORKER = Path(__file__).with_name("init_worker.py")


def _run_worker(backend: str, out: Path) -> dict:
    import os

    if backend == "musa":
        env = sim_env({"MASTER_PORT": str(free_port())})
    else:
        env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS}
        env.update(MASTER_PORT=str(free_port()), OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, str(WORKER), backend, str(out)], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, f"{backend} worker failed:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    return json.loads((out / f"{backend}_report.json").read_text())


@pytest.fixture(scope="module")
def init_runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("device_init")
    return out, _run_worker("musa", out), _run_worker("cpu", out)


def test_weights_are_born_on_the_device_without_a_host_copy(init_runs):
    _, musa, _ = init_runs
    assert musa["device"]["devices"] == ["musa:1"], musa["device"]  # LOCAL_RANK 1's device, before any move
    assert musa["device"]["host_weight_copies"] == 0, musa["device"]
    # the recorder does see host copies: --use-cpu-initialization builds every weight on the host first
    assert musa["host"]["devices"] == ["cpu"] and musa["host"]["host_weight_copies"] >= musa["num_weights"] // 2, musa


def test_the_seed_fixes_the_device_weights(init_runs):
    _, musa, _ = init_runs
    assert musa["same_seed_same_weights"] is True
    assert musa["other_seed_other_weights"] is True


def test_cpu_initialization_gives_the_cpu_backends_weights(init_runs):
    out, musa, _ = init_runs
    on_musa = torch.load(out / "musa_host_init.pt")
    on_cpu = torch.load(out / "cpu_host_init.pt")
    assert on_musa.keys() == on_cpu.keys() and len(on_cpu) == musa["num_weights"]
    for name in on_cpu:
        assert torch.equal(on_musa[name], on_cpu[name]), name
    assert musa["device_init_differs_from_host_init"] is True  # the flag changes where and how they are drawn
