"""patches/megatron_fsdp_host_device_warning.py: on the cpu backend no Megatron-FSDP rank warns that it uses "device
cpu instead of the current device cuda:0" (the host is the device there).

One subprocess (its own backend and 1-rank gloo group) runs megatron-core's ``MegatronFSDP.__init__`` up to where it
warns (the module argument is left out, so it stops just after), first with the patches as ``activate`` applies
them, then with them reverted: the record must be gone in the first case and present in the second (so the test
sees megatron-core still emitting it, and fails if the filter stops matching). ~8 s.
"""

from __future__ import annotations

import os
import subprocess
import sys

SCRIPT = r"""
import logging, sys
import torch
import mtmegatron
from mtmegatron import patches

mtmegatron.activate("cpu")
torch.distributed.init_process_group("gloo", store=torch.distributed.HashStore(), rank=0, world_size=1)
from megatron.core.distributed.fsdp.src.megatron_fsdp.megatron_fsdp import MegatronFSDP

logging.basicConfig(stream=sys.stdout, level=logging.WARNING, format="%(message)s")
for label in ("patched", "reverted"):
    print(label, flush=True)
    try:
        MegatronFSDP.__init__(MegatronFSDP.__new__(MegatronFSDP), module=None, dist_index=None,
                              device=torch.device("cpu"))
    except AttributeError:  # no module: stops right after the device check
        pass
    sys.stdout.flush()
    patches.revert_all()
"""
WARNING = "Megatron-FSDP is using device cpu instead of the current device"


def test_the_false_device_warning_is_filtered_on_the_cpu_backend():
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    patched, reverted = proc.stdout.split("patched\n", 1)[1].split("reverted\n", 1)
    assert WARNING not in patched, patched
    assert f"[Rank 0] {WARNING} cuda:0" in reverted, proc.stdout[-3000:]
