"""The warm start server of helpers/warm_start.py: a Python that has imported torch and forks each job from there.

Run as ``python warm_server.py`` with the jobs' environment (helpers/warm_start.py starts it). It imports torch and
nothing of the project, prints ``ready SOCKET`` and serves: each request names a module, its arguments, a working
directory, the job's environment and three file descriptors (stdin, stdout, stderr); the server forks, and the child
becomes what ``python -m MODULE ARGS`` in that directory with that environment would be after its first
``import torch``: the descriptors on 0/1/2, ``os.environ`` exactly the job's, ``sys.argv``/``sys.orig_argv``/
``sys.path[0]`` as ``-m`` sets them, then ``runpy``'s ``-m`` entry runs the module as ``__main__`` and the interpreter
ends as usual (exceptions, ``SystemExit``, atexit, threads joined). The server answers the job's pid, then its exit
code (``-N`` for signal N, as subprocess does). It ends when its stdin closes (the pytest process ended).

May assume: the jobs' modules import torch before anything else that reads the environment (``mtmegatron``'s
package start-up imports torch first: only its visible-devices sync runs before, a no-op without torch_musa, and
this server declines to serve where torch_musa is findable); the client sends only jobs whose environment equals
the one this server started with (PYTEST_CURRENT_TEST aside), so torch's import saw what the job's would. The
server declines (prints ``decline REASON``) where importing torch left a second thread (a fork would copy a
process with threads; OMP_NUM_THREADS=1 keeps torch's import single-threaded).
"""

import importlib.util
import json
import os
import select
import socket
import sys
import tempfile


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def _decline(reason: str) -> None:
    print(f"decline {reason}", flush=True)
    sys.exit(0)


def _recv_request(conn: socket.socket):
    """(request dict, [stdin, stdout, stderr] fds): one JSON message, length-prefixed, with its fds."""
    header, fds, _, _ = socket.recv_fds(conn, 16, 3)
    size = int(header.decode())
    data = b""
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            raise EOFError("client closed while sending")
        data += chunk
    return json.loads(data), fds


def _become_job(request: dict, fds: list[int], keep_closed: list) -> str:
    """In the forked child: the process ``python -m MODULE ARGS`` would be (see the module docstring)."""
    for obj in keep_closed:
        obj.close()
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
    for fd in set(fds):
        if fd > 2:
            os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    sys.path[0] = os.getcwd()
    sys.orig_argv = list(request["orig_argv"])
    sys.argv = ["-m", *request["args"]]
    return request["module"]


def serve() -> str:
    """The server loop; returns only in a forked child (the module to run as ``__main__``)."""
    if importlib.util.find_spec("torch_musa") is not None:
        _decline("torch_musa is findable: mtmegatron syncs visible devices before it imports torch")
    import torch  # noqa: F401  - the point of this process

    if _threads() != 1:
        _decline(f"importing torch left {_threads()} threads")
    directory = tempfile.mkdtemp(prefix="mtmegatron-warm-")
    path = os.path.join(directory, "socket")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(8)
    print(f"ready {path}", flush=True)
    jobs: dict[int, socket.socket] = {}  # pid -> the connection that waits for its exit code
    lifeline = sys.stdin.fileno()
    while True:
        readable, _, _ = select.select([listener, lifeline], [], [], 0.05)
        if lifeline in readable and not os.read(lifeline, 1024):
            listener.close()
            os.unlink(path)
            os.rmdir(directory)
            os._exit(0)
        if listener in readable:
            conn, _ = listener.accept()
            try:
                request, fds = _recv_request(conn)
            except (OSError, ValueError, EOFError):
                conn.close()
                continue
            pid = os.fork()
            if pid == 0:
                return _become_job(request, fds, [listener, conn, *jobs.values()])
            for fd in fds:
                os.close(fd)
            conn.sendall(f"{pid}\n".encode())
            jobs[pid] = conn
        while jobs:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            conn = jobs.pop(pid, None)
            if conn is not None:
                try:
                    conn.sendall(f"{os.waitstatus_to_exitcode(status)}\n".encode())
                except OSError:
                    pass
                conn.close()


if __name__ == "__main__":
    import runpy

    _module = serve()
    try:
        runpy._run_module_as_main(_module, alter_argv=True)  # what ``python -m`` calls
    except (SystemExit, KeyboardInterrupt):
        raise
    except BaseException as error:  # the interpreter's report and exit code, without this file's frame
        error.__traceback__ = error.__traceback__.tb_next
        sys.excepthook(type(error), error, error.__traceback__)
        sys.exit(1)
