"""A failed node stops the whole HOSTFILE run (issue 41): once both nodes' ranks are up, node 1's torchrun agent
is killed (SIGKILL); the launcher names the node, stops node 0 within 30 s and leaves no process of the run
behind: no agent, no rank (torchrun starts its ranks in sessions of their own, so they are found by the run id
in their environment)."""

from __future__ import annotations

import time
import uuid

import psutil

from helpers.ports import free_port
from launcher_runs import ARGS, HOSTFILE, LOCAL_SHELL, launch_env, run_processes, start


def _node_processes(run_id: str, node: int) -> tuple[list[psutil.Process], list[psutil.Process]]:
    """(node's torchrun agents, node's ranks)."""
    agents, ranks = [], []
    for proc in run_processes(run_id):
        try:
            if proc.environ()["MTMEGATRON_RUN_ID"] != f"{run_id}-node{node}":
                continue
            cmd = " ".join(proc.cmdline())
        except psutil.Error:
            continue
        if "torchrun" in cmd or "torch.distributed.run" in cmd:
            agents.append(proc)
        elif "mtmegatron.pretrain" in cmd:
            ranks.append(proc)
    return agents, ranks


def test_killing_one_agent_stops_every_node(tmp_path):
    (tmp_path / "hostfile").write_text(HOSTFILE)
    run_id = f"stoptest-{uuid.uuid4().hex[:12]}"
    env = launch_env(HOSTFILE="hostfile", REMOTE_SHELL=LOCAL_SHELL, MASTER_PORT=str(free_port()), RDZV_ID=run_id)
    args = [*ARGS[:ARGS.index("--train-iters") + 1], "100000", *ARGS[ARGS.index("--train-iters") + 2:]]
    proc = start(tmp_path, env, args)
    try:
        deadline = time.monotonic() + 120
        while True:  # both nodes' ranks started: the rendezvous is done
            agents, ranks = _node_processes(run_id, 1)
            if agents and ranks and _node_processes(run_id, 0)[1]:
                break
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.2)
        agents[0].kill()
        killed = time.monotonic()
        out, err = proc.communicate(timeout=30)
        assert time.monotonic() - killed < 30
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0
    assert "node 1 (localhost) stopped with exit status 137: stopping every node" in err, err
    left = run_processes(run_id)
    assert not left, [p.cmdline() for p in left]
