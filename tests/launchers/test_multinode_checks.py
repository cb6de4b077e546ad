"""The many-nodes pieces of examples/multinode.sh that need no training run: Slurm node lists (bracket forms,
scontrol when present), the Slurm variables becoming NNODES/NODE_RANK/MASTER_ADDR, and the one-line errors (exit
2) a HOSTFILE or a Slurm node gives before anything starts: an unreachable host, a world size the layout does not
divide, more processes than devices, a missing HF_DIR, a hostfile line it cannot read."""

from __future__ import annotations

import subprocess

import pytest

from launcher_runs import LOCAL_SHELL, ROOT, launch_env

MULTINODE = ROOT / "examples" / "multinode.sh"
COMMON = ROOT / "examples" / "common.sh"
CUDA = "examples/llama3/dist_run_pretrain_megatron_llama3_cuda.sh"  # no Python before the launch: cheap to start
NAME = "dist_run_pretrain_megatron_llama3_cuda.sh"
NODELISTS = {
    "node[01-03,07],gpu5": "node01 node02 node03 node07 gpu5",
    "localhost,127.0.0.1": "localhost 127.0.0.1",
    "a[9-11]": "a9 a10 a11",
    "x-[001-002].ib,y": "x-001.ib x-002.ib y",
    "rack[1-2]-n[1-2]": "rack1-n1 rack1-n2 rack2-n1 rack2-n2",
}


def test_slurm_nodelists_expand():
    script = f"source {MULTINODE}; for l in \"$@\"; do echo $(expand_nodelist \"$l\"); done"
    proc = subprocess.run(["bash", "-c", script, "x", *NODELISTS], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == list(NODELISTS.values())


def _slurm_view(env: dict) -> list[str]:
    script = f"source {COMMON}; echo $NNODES $NODE_RANK $MASTER_ADDR $MASTER_PORT"
    proc = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split()


def test_slurm_variables_say_the_node(tmp_path):
    slurm = {"SLURM_JOB_ID": "20007", "SLURM_NNODES": "3", "SLURM_NODEID": "2", "SLURM_JOB_NODELIST": "gpu[07-09]"}
    bare = launch_env(**slurm, PATH="/usr/bin:/bin")  # no scontrol there: the bracket form is parsed
    assert _slurm_view(bare) == ["3", "2", "gpu07", "20007"]  # port 20000 + job id % 20000
    assert _slurm_view({**bare, "MASTER_ADDR": "head", "NODE_RANK": "0"})[1:3] == ["0", "head"]  # exported wins
    (tmp_path / "scontrol").write_text("#!/bin/sh\necho first-from-scontrol\necho other\n")
    (tmp_path / "scontrol").chmod(0o755)
    assert _slurm_view({**bare, "PATH": f"{tmp_path}:/usr/bin:/bin"})[2] == "first-from-scontrol"
    assert _slurm_view(launch_env()) == ["1", "0", "127.0.0.1", "29500"]  # no Slurm: today's defaults


def _refused(tmp_path, hostfile: str | None, args=(), **env) -> str:
    if hostfile is not None:
        (tmp_path / "hostfile").write_text(hostfile)
        env = {"HOSTFILE": "hostfile", "REMOTE_SHELL": LOCAL_SHELL, **env}
    proc = subprocess.run(["bash", str(ROOT / CUDA), "--backend", "cpu", *args], capture_output=True, text=True,
                          cwd=tmp_path, env=launch_env(**env), timeout=60)
    assert proc.returncode == 2 and proc.stdout == "", (proc.stdout, proc.stderr)
    assert len(proc.stderr.splitlines()) == 1 and not (tmp_path / "runs").exists(), proc.stderr
    return proc.stderr.strip()


def test_hostfile_mistakes_are_one_line_before_anything_starts(tmp_path):
    two = "127.0.0.1 slots=1\nlocalhost slots=1\n"
    assert _refused(tmp_path, two, REMOTE_SHELL="false") == \
        f"{NAME}: HOSTFILE hostfile: cannot reach 127.0.0.1 with 'false' (exit status 1)"
    assert _refused(tmp_path, "127.0.0.1 slots=2\nlocalhost slots=1\n") == \
        f"{NAME}: HOSTFILE hostfile: world size 3 is not divisible by TP 2 x PP 1 x CP 1 (2 hosts, 2 1 processes)"
    assert _refused(tmp_path, two, ["--tensor-model-parallel-size", "1", "--pipeline-model-parallel-size", "4"]) \
        == f"{NAME}: HOSTFILE hostfile: world size 2 is not divisible by TP 1 x PP 4 x CP 1 (2 hosts, 1 1 processes)"
    assert _refused(tmp_path, two, HF_DIR=str(tmp_path / "nowhere")) == \
        f"{NAME}: 127.0.0.1: HF_DIR {tmp_path / 'nowhere'} is not there (nor its converted checkpoint)"
    assert _refused(tmp_path, "# only a comment\n\n") == f"{NAME}: HOSTFILE hostfile names no host"
    assert _refused(tmp_path, "node1 slots=0\n") == f"{NAME}: HOSTFILE hostfile: slots=0 for node1 (a positive count)"
    assert _refused(tmp_path, "node1 max_slots=2\n") == \
        f"{NAME}: HOSTFILE hostfile: 'max_slots=2' after host node1 (expected slots=N)"


def test_a_slurm_node_checks_itself(tmp_path):
    slurm = {"SLURM_JOB_ID": "7", "SLURM_NNODES": "2", "SLURM_NODEID": "1", "SLURM_JOB_NODELIST": "n[1-2]",
             "NPROC_PER_NODE": "1"}
    assert _refused(tmp_path, None, ["--tensor-model-parallel-size", "4"], **slurm) == \
        f"{NAME}: world size 2 is not divisible by TP 4 x PP 1 x CP 1 (2 nodes x NPROC_PER_NODE 1)"
    assert _refused(tmp_path, None, HF_DIR="/nowhere/hf", **slurm).endswith(
        ": HF_DIR /nowhere/hf is not there (nor its converted checkpoint)")


@pytest.mark.parametrize("facts,error", [("devices=4", "gpu1: 8 processes per node but it has 4 cuda devices"),
                                         ("devices=8", ""), ("devices=", "")])
def test_more_processes_than_devices(facts, error):
    script = f"source {MULTINODE}; BACKEND_USED=cuda; check_node_facts gpu1 8 \"$1\""
    proc = subprocess.run(["bash", "-c", script, "x.sh", facts], capture_output=True, text=True)
    assert proc.returncode == (2 if error else 0)
    assert proc.stderr == (f"x.sh: {error} (NPROC_PER_NODE or slots=)\n" if error else "")
