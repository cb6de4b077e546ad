"""A scheduler's SIGTERM to a whole torchrun job with ``--exit-signal-handler``: every rank finishes its iteration,
saves, exits 0, torchrun exits 0, and the next run continues from that checkpoint.

torchrun's agent forwards the signal to each rank's process group (each rank leads one: its DataLoader workers
are in it); a scheduler such as Slurm signals every process of the job itself. Both deliveries are covered, with
and without DataLoader workers, in two launches: the second resumes from the first's checkpoint."""

from __future__ import annotations

import json
import os
import signal

import psutil

from helpers.launch import launch, rows, wait_for
from helpers.pretrain_runner import TINY
from mtmegatron.training.checkpointing import latest_complete_iteration

ARGS = TINY + ["--use-distributed-optimizer", "--train-iters", "100000", "--exit-signal-handler"]


def _iterations(log_dir) -> list[int]:
    return [json.loads(line)["iteration"] for line in rows(log_dir)]


def _every_process(proc) -> list[int]:
    return [proc.pid] + [p.pid for p in psutil.Process(proc.pid).children(recursive=True)]


def _stop_and_check(proc, log_dir, ckpt, deliver) -> int:
    wait_for(lambda: len(rows(log_dir)) >= 2, proc, what="two iterations")
    deliver(proc)
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, f"torchrun exited {proc.returncode}:\n{out[-2000:]}\n{err[-4000:]}"
    last = _iterations(log_dir)[-1]
    assert f"SIGTERM received: stopping after iteration {last}" in out
    assert latest_complete_iteration(str(ckpt)) == last  # a complete checkpoint: every rank saved its part
    assert "Traceback" not in err and "killed by signal" not in err, err[-4000:]
    return last


def test_sigterm_to_the_whole_job_saves_exits_0_and_resumes(tmp_path):
    ckpt = tmp_path / "ckpt"
    # 1: DataLoader workers (the default --num-workers 2), SIGTERM to every process of the job as Slurm's
    # scancel does: torchrun, both ranks and their DataLoader workers (which torchrun then signals again)
    proc = launch(2, ARGS + ["--save", str(ckpt)], tmp_path / "log1", new_session=True)

    def everyone(p):
        for pid in _every_process(p):
            os.kill(pid, signal.SIGTERM)

    first = _stop_and_check(proc, tmp_path / "log1", ckpt, everyone)
    # 2: no DataLoader workers, resumed from that checkpoint, SIGTERM to torchrun's process group only
    proc = launch(2, ARGS + ["--num-workers", "0", "--save", str(ckpt), "--load", str(ckpt)], tmp_path / "log2",
                  new_session=True)
    second = _stop_and_check(proc, tmp_path / "log2", ckpt, lambda p: os.killpg(p.pid, signal.SIGTERM))
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

    from mtmegatron.training import torchrun_exit

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
    hook = torchrun_exit._quiet_user_error_hook(lambda *a: (_ for _ in ()).throw(AssertionError("reported")))
    try:
        hook(type(exc), exc, tb)
    except Exited as e:
        return f"exit {e.args[0]}"
    except AssertionError as e:
        return str(e)
    return "returned"


def test_torchrun_exits_0_after_a_signal_only_when_every_worker_did(monkeypatch, capsys):
    assert _hook_outcome(monkeypatch, [0, 0]) == "exit 0"
    assert "SIGTERM received; all 2 workers of this node exited 0" in capsys.readouterr().err
    # a rank killed (SIGKILL after the agent's --shutdown-timeout) or without a handler: torchrun's report, status 1
    assert _hook_outcome(monkeypatch, [0, -9]) == "reported"
    assert _hook_outcome(monkeypatch, [-15, -15]) == "reported"
