"""Issue 41's acceptance on one machine (CPU, fp32, the tiny Llama-3 of the llama3 launcher, TP2 over 2 ranks):
a HOSTFILE of two hosts (127.0.0.1 and localhost, slots=1 each) started through a REMOTE_SHELL that runs the
command here trains with world size 2 over two torchrun agents (c10d), writes both node logs and says where,
and its losses equal the single-node 2-rank run's; so do two launches by hand with the Slurm variables set."""

from __future__ import annotations

import subprocess

import pytest

from helpers.ports import free_port
from launcher_runs import HOSTFILE, ITERS, LOCAL_SHELL, SCRIPT, launch_env, losses, start

RUN = "runs/dist_run_pretrain_megatron_llama3_musa"


def _finish(proc: subprocess.Popen) -> tuple[str, str]:
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-4000:]
    return out, err


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("single")
    _finish(start(cwd, launch_env(NPROC_PER_NODE="2", MASTER_PORT=str(free_port()))))
    return losses(cwd)


@pytest.fixture(scope="module")
def hostfile_run(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("hostfile")
    (cwd / "hostfile").write_text(HOSTFILE)
    env = launch_env(HOSTFILE="hostfile", REMOTE_SHELL=LOCAL_SHELL, MASTER_PORT=str(free_port()))
    out, _ = _finish(start(cwd, env))
    return cwd, out


@pytest.fixture(scope="module")
def slurm_run(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("slurm")
    port = str(free_port())
    procs = [start(cwd, launch_env(SLURM_JOB_ID="4141", SLURM_NNODES="2", SLURM_NODEID=str(node), NPROC_PER_NODE="1",
                                   SLURM_JOB_NODELIST="localhost,127.0.0.1", MASTER_PORT=port)) for node in (0, 1)]
    outs = [_finish(p) for p in procs]
    return cwd, outs


def test_single_node_loss_falls(single):
    assert len(single) == ITERS and single[-1] < single[0] - 0.2, single


def test_hostfile_starts_two_agents_with_c10d_and_equals_one_node(hostfile_run, single):
    cwd, out = hostfile_run
    for k, host in enumerate(("127.0.0.1", "localhost")):
        assert f"node {k} of 2 ({host}, 1 processes): log in {RUN}/node{k}.log" in out
        assert (cwd / RUN / f"node{k}.log").is_file()
    assert "all 2 nodes finished" in out
    logs = [(cwd / RUN / f"node{k}.log").read_text() for k in (0, 1)]
    printing = [log for log in logs if " iteration      4/     4 |" in log]  # the node where rank 0 landed
    assert len(printing) == 1 and "world 2 = TP 2 x PP 1 x DP 1" in printing[0]
    assert losses(cwd) == single


def test_slurm_variables_place_two_launches_and_equal_one_node(slurm_run, single):
    cwd, outs = slurm_run
    assert " iteration      4/     4 |" in outs[0][0] and "world 2 = TP 2 x PP 1 x DP 1" in outs[0][0]
    assert "iteration" not in outs[1][0]  # SLURM_NODEID 1 holds rank 1
    assert losses(cwd) == single
