"""A process no launcher started makes its own one-rank group: two at once on one box must not collide on a
port, a MASTER_PORT the user set is the one its store listens on, and a MASTER_ADDR left in the shell for a
multi-node job (here an unroutable documentation address) does not send the rank to another host."""

from __future__ import annotations

import os
import subprocess
import sys

from helpers.ports import free_port
from helpers.pretrain_runner import LAUNCHER_VARS

SNIPPET = """
import datetime, os, torch
from mtmegatron.training.setup import init_lone_process_group
init_lone_process_group("gloo", datetime.timedelta(seconds=30))
t = torch.ones(1)
torch.distributed.all_reduce(t)
print(os.environ["MASTER_PORT"], torch.distributed.get_world_size(), os.environ["RANK"], float(t), flush=True)
torch.distributed.destroy_process_group()
"""


def _start(extra: dict) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS}
    return subprocess.Popen([sys.executable, "-c", SNIPPET], env={**env, **extra}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_lone_processes_get_their_own_ports_and_honour_master_port():
    chosen = free_port()
    procs = [_start({}), _start({}), _start({"MASTER_PORT": str(chosen), "MASTER_ADDR": "192.0.2.1"})]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=180)
        assert proc.returncode == 0, err[-3000:]
        port, world, rank, value = out.split()
        assert (world, rank, value) == ("1", "0", "1.0")
        results.append(int(port))
    assert results[0] != results[1], "two lone runs shared a port"
    assert results[2] == chosen
