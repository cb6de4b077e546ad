"""The accelerator lane for ``--model llava``: TP2+SP on ``--backend musa`` under the simulated MUSA device
(tests/musa_sim: a device that is not the host, real torchada, an ``mccl`` that refuses host tensors) against
the same command on ``--backend cpu``.

Checks, as the lane's (tests/musa_sim/test_lane.py): per-iteration losses within 1e-5 and the same image-token
counts; the held-out losses with and without the images (image_eval.json) within 1e-5 and the same greedy
answers (samples.txt: the decode loop runs the whole model, encoder included, on the device); rank 0's
placement line (every parameter, buffer, gradient buffer and optimizer state on the device:
training/placement.py); every rank's ``mccl`` group ran collectives and refused no host tensor.

What this case adds to the lane: the CLIP encoder's patch embedding is a ``Conv2d`` (the simulator's
``convolution_overrideable`` kernels), and megatron-core's ``CLIPViTModel.position_ids`` is a plain attribute
made with ``.cuda()`` at construction, which ``Module.to`` and the placement check do not see. It lands on
``musa:<LOCAL_RANK>`` because torchada maps ``.cuda()`` to the current device, set before the model is built
(training/setup.py). Moved to the host, or to ``musa:0`` on rank 1, the vision forward fails in the simulator
with "Expected all tensors to be on the same device" (aten::index_select under the position embedding; both
verified by patching the attribute), so this case fails if that ever changes.
"""

from __future__ import annotations

import json
import math

import pytest

from helpers.musa_sim import assert_device_run, sim_env
from helpers.pretrain_runner import run_pretrain

pytestmark = pytest.mark.musa_sim

ITERS = 3
LOSS_TOL = 1e-5
ARGS = ["--model", "llava", "--tensor-model-parallel-size", "2", "--sequence-parallel", "--train-iters", str(ITERS),
        "--hidden-dropout", "0", "--attention-dropout", "0", "--lr", "2e-3", "--lr-decay-style", "constant",
        "--log-interval", "100", "--eval-iters", "1", "--eval-interval", str(ITERS), "--num-samples", "1",
        "--sample-tokens", "2",
        "--use-cpu-initialization"]  # host init on both backends: the weights the cpu backend builds


def test_llava_tp2_sp_on_the_simulated_device_matches_the_cpu_backend(tmp_path):
    stats = tmp_path / "stats"
    musa, musa_rows = run_pretrain(2, ["--backend", "musa", *ARGS], tmp_path / "musa", timeout=400,
                                   env=sim_env({"MUSA_SIM_STATS_DIR": str(stats)}))
    _, cpu_rows = run_pretrain(2, ["--backend", "cpu", *ARGS], tmp_path / "cpu", timeout=400)

    assert [r["iteration"] for r in musa_rows] == [r["iteration"] for r in cpu_rows] == list(range(1, ITERS + 1))
    for m, c in zip(musa_rows, cpu_rows):
        assert math.isfinite(m["loss"]) and abs(m["loss"] - c["loss"]) <= LOSS_TOL, (m["iteration"], m, c)
        assert m["image_tokens"] == c["image_tokens"] > 0, (m, c)
    musa_eval, cpu_eval = (json.loads((tmp_path / b / "image_eval.json").read_text()) for b in ("musa", "cpu"))
    for key in ("val_loss", "val_loss_blank_images"):
        assert abs(musa_eval[key] - cpu_eval[key]) <= LOSS_TOL, (key, musa_eval, cpu_eval)
    samples = (tmp_path / "musa" / "samples.txt").read_text()
    assert samples.count("model:") == 1 and samples == (tmp_path / "cpu" / "samples.txt").read_text()

    assert_device_run(musa.stdout, stats)
