"""SIGTERM with ``--exit-signal-handler`` under torchrun: every rank finishes its iteration, saves, exits 0,
torchrun exits 0, and the next run continues from that checkpoint.

A scheduler's SIGTERM to the whole job: torchrun's agent forwards it to each rank's process group (each rank
leads one: its DataLoader workers are in it), and a scheduler such as Slurm signals every process of the job
itself; both at once, with DataLoader workers. Then the resume, without DataLoader workers, is stopped by SIGTERM
to rank 1 alone (one node preempted): all ranks agree and stop after the same iteration. Two launches.
The second half: a job or a ``run_ranks`` rank past its time fails with every rank's Python stack.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

import psutil
import pytest

from helpers.launch import finish, launch, rank_pid, rows, wait_for
from helpers.pretrain_runner import LAUNCHER_VARS, STACKS_ENV, TINY, free_port, run_job
from helpers.ranks import run_ranks
from mtmegatron.utils.checkpoint_dirs import latest_complete_iteration

ARGS = TINY + ["--use-distributed-optimizer", "--train-iters", "100000", "--exit-signal-handler"]


def _iterations(log_dir) -> list[int]:
    return [json.loads(line)["iteration"] for line in rows(log_dir)]


def _whole_job(proc) -> None:
    """SIGTERM to torchrun's process group (its agent), then to every process of the job as Slurm's scancel."""
    os.killpg(proc.pid, signal.SIGTERM)
    for child in psutil.Process(proc.pid).children(recursive=True):
        try:
            child.send_signal(signal.SIGTERM)
        except psutil.Error:
            pass


def _stop_and_check(proc, log_dir, ckpt, deliver, agent_signalled: bool) -> int:
    wait_for(lambda: rows(log_dir), proc, what="the first iteration")
    deliver(proc)
    out, err = finish(proc)
    assert proc.returncode == 0, f"torchrun exited {proc.returncode}:\n{out[-2000:]}\n{err[-4000:]}"
    last = _iterations(log_dir)[-1]
    assert f"SIGTERM received: stopping after iteration {last}" in out
    assert latest_complete_iteration(str(ckpt)) == last  # a complete checkpoint: every rank saved its part
    assert (log_dir / "loss.png").exists()
    assert "Traceback" not in err and "killed by signal" not in err, err[-4000:]
    # a signalled agent exits 0 through torchrun_exit, only when every rank exited 0
    assert ("torchrun: SIGTERM received; all 2 ranks of this node exited 0" in err) == agent_signalled, err[-4000:]
    return last


def test_sigterm_to_the_whole_job_saves_exits_0_and_resumes(tmp_path):
    ckpt = tmp_path / "ckpt"
    # 1: DataLoader workers (the default --num-workers 2) and SIGTERM to every process of the job
    proc = launch(2, ARGS + ["--num-workers", "2", "--save", str(ckpt)], tmp_path / "log1", new_session=True)
    first = _stop_and_check(proc, tmp_path / "log1", ckpt, _whole_job, agent_signalled=True)
    # 2: resumed from that checkpoint without DataLoader workers; SIGTERM to rank 1 only
    proc = launch(2, ARGS + ["--num-workers", "0", "--save", str(ckpt), "--load", str(ckpt)], tmp_path / "log2",
                  new_session=True)
    second = _stop_and_check(proc, tmp_path / "log2", ckpt, lambda p: os.kill(rank_pid(p, 1), signal.SIGTERM),
                             agent_signalled=False)
    assert _iterations(tmp_path / "log2")[0] == first + 1
    assert second > first


class _Worker:
    def __init__(self, code):
        self.proc = type("Proc", (), {"poll": lambda _self: code})()


class _Agent:
    def __init__(self, codes):
        context = type("Context", (), {})()
        context.subprocess_handlers = {rank: _Worker(code) for rank, code in enumerate(codes)}
        self._pcontext = context


def _hook_outcome(monkeypatch, codes) -> str:
    """What torchrun_exit's hook does with a SignalException raised while the agent's workers ended with ``codes``."""
    from torch.distributed.elastic.multiprocessing.api import SignalException

    from mtmegatron.training.resilience import torchrun_exit

    class Exited(Exception):
        pass

    def fake_exit(status):
        raise Exited(status)

    monkeypatch.setattr(torchrun_exit.os, "_exit", fake_exit)

    def run(agent):  # holds the agent in a frame, as torch's launch_agent does
        raise SignalException("got signal: 15", sigval=signal.SIGTERM)

    try:
        run(_Agent(codes))
    except SignalException as e:
        exc, tb = e, e.__traceback__
    hook = torchrun_exit._quiet_exit_hook(lambda *a: (_ for _ in ()).throw(AssertionError("reported")))
    try:
        hook(type(exc), exc, tb)
    except Exited as e:
        return f"exit {e.args[0]}"
    except AssertionError as e:
        return str(e)
    return "returned"


def test_torchrun_exits_0_after_a_signal_only_when_every_worker_did(monkeypatch, capsys):
    assert _hook_outcome(monkeypatch, [0, 0]) == "exit 0"
    assert "SIGTERM received; all 2 ranks of this node exited 0" in capsys.readouterr().err
    # a rank killed (SIGKILL after the agent's --shutdown-timeout) or without a handler: torchrun's report, status 1
    assert _hook_outcome(monkeypatch, [0, -9]) == "reported"
    assert _hook_outcome(monkeypatch, [-15, -15]) == "reported"


# ---- a job past its time fails with every rank's Python stack ----------------------------------------------------
SLEEPER = "import time\ndef sleeping_rank():\n    time.sleep(3600)\nprint('started', flush=True)\nsleeping_rank()\n"


def test_a_torchrun_job_past_its_time_fails_with_every_ranks_stack(tmp_path):
    script = tmp_path / "sleeper.py"
    script.write_text(SLEEPER)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={free_port()}",
           str(script)]
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS} | STACKS_ENV
    started = time.monotonic()
    with pytest.raises(AssertionError) as failure:
        run_job(cmd, env, timeout=8, what="sleeper")
    message = str(failure.value)
    assert message.startswith("sleeper ran past 8 s; every rank's Python stack"), message[:2000]
    assert message.count(f'File "{script}", line 3 in sleeping_rank') == 2, message[:4000]  # both ranks
    assert time.monotonic() - started < 40
    assert not [p for p in psutil.process_iter(["cmdline"]) if str(script) in " ".join(p.info["cmdline"] or [])]


def _sleeping_rank(rank, world_size, backend_name):
    if rank == 1:
        time.sleep(3600)
    return rank


def test_a_hung_rank_of_run_ranks_fails_with_its_stack():
    with pytest.raises(pytest.fail.Exception) as failure:
        run_ranks(_sleeping_rank, 2, "cpu", timeout=6)
    rank1 = str(failure.value).partition("--- rank 1 ---")[2]  # (rank 0 returns, unless it starts too slowly)
    assert "Python stacks (faulthandler, SIGABRT after the timeout)" in rank1, str(failure.value)[:3000]
    assert "in _sleeping_rank" in rank1, str(failure.value)[:3000]
