"""``start(cmd, env)``: a job ``python -m MODULE ARGS`` forked from a Python that already imported torch, or None.

Every one-rank run of the suite starts a fresh Python that imports torch (about 1.5 CPU-s of its ~5). Here a server
per pytest process (helpers/warm_server.py) imports torch once and forks each job from there; the child then is
the process ``python -m MODULE ARGS`` would be right after its first ``import torch``: the same argv
(``sys.argv``, ``sys.orig_argv``), environment (``os.environ`` exactly the job's), working directory, stdin and
``sys.path``, and it ends as that Python does. What still differs, and why it is harmless:
- the process's own command line (``/proc/PID/cmdline``) is the server's; only the launcher-aware stop
  (pretrain_runner.stop_with_stacks) reads it, and it is told which jobs are launchers;
- Python's string-hash seed is the server's, not one per job: two servers take turns, so two jobs in a row (the
  two runs a test compares) still run under different seeds, as two fresh Pythons do.
Which jobs: only ``[sys.executable, "-m", M, ...]`` with M in MODULES (their first import that reads the environment
is torch, see warm_server.py; torchrun only when it launches mtmegatron.pretrain: a test that looks for a job's
processes by a script's name in their command lines still finds them all), and only under the environment a server started with (a job with another
environment, e.g. another PYTHONPATH or a leaked NVTE_* variable, gets a server of its own; PYTEST_CURRENT_TEST,
which pytest changes per test, and the project's MTMEGATRON_* variables, which only the project's code reads, are not
compared: the job gets them all). ``MTMEGATRON_TEST_WARM_START=0`` turns it off (every job a fresh
Python, as before); a server that declines (see warm_server.py) turns it off for that environment.

May assume: Linux (fds passed over a Unix socket, /proc); the caller reads the job's stdout/stderr to their end
(``WarmJob.communicate``), as ``subprocess.Popen.communicate`` does.
"""

from __future__ import annotations

import atexit
import json
import os
import selectors
import socket
import subprocess
import sys
import time
from pathlib import Path

SWITCH = "MTMEGATRON_TEST_WARM_START"
MODULES = ("mtmegatron.pretrain", "mtmegatron.cli", "torch.distributed.run")
LAUNCHERS = ("torch.distributed.run",)
# not compared: pytest's per-test variable, and the project's own variables (read by mtmegatron's code, which runs
# in the job, after the fork; the server imports torch only, which does not know them)
UNCOMPARED_NAMES = ("PYTEST_CURRENT_TEST",)
UNCOMPARED_PREFIX = "MTMEGATRON_"
SERVER = Path(__file__).with_name("warm_server.py")


def _key(env: dict) -> tuple:
    """What a server's start-up saw: the environment and the working directory (relative PYTHONPATH entries)."""
    return os.getcwd(), tuple(sorted((k, v) for k, v in env.items()
                                     if k not in UNCOMPARED_NAMES and not k.startswith(UNCOMPARED_PREFIX)))


class _Server:
    """One warm_server.py process: started with ``env``; ``None`` socket when it declined."""

    def __init__(self, env: dict):
        self.key = _key(env)
        self.proc = subprocess.Popen([sys.executable, str(SERVER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, env=env, text=True)
        line = self.proc.stdout.readline().split()
        self.socket = line[1] if line[:1] == ["ready"] else None

    def close(self) -> None:
        try:
            self.proc.stdin.close()  # the server's lifeline: it ends
            self.proc.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()


_SERVERS: list[_Server | None] = [None, None]  # taken in turns (see the hash seed in the module docstring)
_turn = [0]


def _close_all() -> None:
    for i, server in enumerate(_SERVERS):
        if server is not None:
            server.close()
            _SERVERS[i] = None


atexit.register(_close_all)


def _server_for(env: dict) -> _Server | None:
    slot = _turn[0]
    _turn[0] = 1 - slot
    server = _SERVERS[slot]
    if server is None or server.key != _key(env) or server.proc.poll() is not None:
        if server is not None:
            server.close()
        server = _SERVERS[slot] = _Server(env)
    return server if server.socket else None


class WarmJob:
    """The parts of ``subprocess.Popen`` (text pipes for stdout and stderr) the runners use."""

    def __init__(self, cmd: list[str], env: dict, server: _Server):
        self.args = cmd
        self.returncode = None
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        self._conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._conn.connect(server.socket)
        request = json.dumps({"module": cmd[2], "args": cmd[3:], "orig_argv": cmd, "cwd": os.getcwd(),
                              "env": env}).encode()
        socket.send_fds(self._conn, [f"{len(request):016d}".encode()], [0, out_w, err_w])
        self._conn.sendall(request)
        os.close(out_w)
        os.close(err_w)
        self._reply = self._conn.makefile("r")
        self.pid = int(self._reply.readline())
        self._pipes = {out_r: [], err_r: []}
        self._out, self._err = out_r, err_r

    def _read_pipes(self, deadline: float | None) -> None:
        with selectors.DefaultSelector() as sel:
            for fd in self._pipes:
                sel.register(fd, selectors.EVENT_READ)
            while sel.get_map():
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise subprocess.TimeoutExpired(self.args, 0)
                for key, _ in sel.select(left):
                    chunk = os.read(key.fd, 65536)
                    if chunk:
                        self._pipes[key.fd].append(chunk)
                    else:
                        sel.unregister(key.fd)
                        os.close(key.fd)

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self._conn.settimeout(timeout)
            try:
                line = self._reply.readline()
            except TimeoutError:
                raise subprocess.TimeoutExpired(self.args, timeout) from None
            self.returncode = int(line) if line.strip() else -9
            self._conn.close()
        return self.returncode

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            self._read_pipes(deadline)
        except subprocess.TimeoutExpired:
            raise subprocess.TimeoutExpired(self.args, timeout) from None
        self.wait(None if deadline is None else max(deadline - time.monotonic(), 1.0))
        encoding = subprocess._text_encoding()  # what Popen(text=True) decodes with, and its newline translation
        return tuple(subprocess.Popen._translate_newlines(None, b"".join(self._pipes[fd]), encoding, "strict")
                     for fd in (self._out, self._err))

    def poll(self):
        return self.returncode

    def kill(self) -> None:
        try:
            os.kill(self.pid, 9)
        except OSError:
            pass


def start(cmd: list[str], env: dict) -> WarmJob | None:
    """``cmd`` forked warm under ``env`` (see the module docstring), or None: start it as a fresh Python."""
    if os.environ.get(SWITCH, "1") == "0" or env.get(SWITCH, "1") == "0":
        return None
    if len(cmd) < 3 or cmd[0] != sys.executable or cmd[1] != "-m" or cmd[2] not in MODULES:
        return None
    if cmd[2] in LAUNCHERS and "mtmegatron.pretrain" not in cmd:  # a launcher of anything else stays as it was
        return None
    server = _server_for(env)
    return WarmJob(cmd, env, server) if server is not None else None
