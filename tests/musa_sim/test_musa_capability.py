"""``--bf16`` on a simulated MUSA device without bf16 (``MUSA_SIM_CAPABILITY=2.1``, an S80's arch): pretrain exits
with status 2 and one line before any process group starts (the decision itself: tests/conformance/
test_musa_device.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from helpers.musa_sim import sim_env

pytestmark = pytest.mark.musa_sim


def test_bf16_is_refused_on_a_device_without_it():
    done = subprocess.run([sys.executable, "-m", "mtmegatron.pretrain", "--backend", "musa", "--bf16", "--mock-data"],
                          env=sim_env({"MUSA_SIM_CAPABILITY": "2.1"}), capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, (done.stdout[-2000:], done.stderr[-4000:])
    errors = [line for line in done.stderr.splitlines() if "error" in line]
    assert len(errors) == 1 and "--bf16: this MUSA device (arch 210" in errors[0], done.stderr[-4000:]
