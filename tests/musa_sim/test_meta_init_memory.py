"""``--init-model-with-meta-device`` on the simulated MUSA device: no rank materialises the whole model.

Four ranks set up the tiny Llama-3 (723,200 parameter bytes) under Megatron-FSDP optim_grads_params at DP4
(meta_init_worker.py); the simulator counts every byte allocated on each rank's device. With meta init the
model is born on the meta device and Megatron-FSDP materialises one module at a time, so the device peak of the
set-up stays below the whole model's bytes: what remains are Megatron-FSDP's buffers (the weight, fp32 main weight
and gradient shards: 3 x 1/4 of the model) plus at most one module in flight. Measured: peak 580,096 B per rank,
555,512 B of it the buffers that stay. The measurement can fail: without the flag (measured by hand, same worker)
each rank builds the whole model on its device first and the peak is 921,376 B (above the model's 723,200 B).
At DP2 it cannot tell the two apart: the three half-model shards (1.5x the model) already exceed the born model,
and both peaks equal the buffers (1,093,190 B). Cost: one 4-rank run, ~30 s.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.musa_sim import sim_env
from helpers.pretrain_runner import free_port

pytestmark = pytest.mark.musa_sim

WORKER = Path(__file__).with_name("meta_init_worker.py")
NPROC = 4


def test_meta_init_peak_stays_below_the_whole_model(tmp_path):
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={NPROC}", f"--master_port={free_port()}",
           str(WORKER), str(tmp_path), "meta"]
    done = subprocess.run(cmd, env=sim_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"worker failed:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    reports = [json.loads((tmp_path / f"meta_rank{r}.json").read_text()) for r in range(NPROC)]
    for rank, report in enumerate(reports):
        assert report["after"] > 0, report  # the buffers are on the device: the simulator counted them
        assert report["peak"] < report["model_bytes"], f"rank {rank} materialised the whole model: {report}"
