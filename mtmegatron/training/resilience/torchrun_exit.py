"""Makes ``torchrun ... -m mtmegatron.pretrain`` end with status 2 and no traceback after a user error, and with 0
after a termination signal that every rank answered by saving and exiting 0.

torchrun's agent turns any non-zero worker exit into a ``ChildFailedError``: an error log line, a Python
traceback and a failure block, and status 1. ``mtmegatron.pretrain`` exits 2 only for a user mistake whose one
message rank 0 has already printed (every rank runs the same validation and exits 2), so for that job the
agent's report is noise that hides the message. This module is loaded into the agent through torch's own
plugin group ``torchrun.handlers`` (pyproject.toml; torch imports every such entry point when torchrun starts)
and changes only this case: the agent's training module is ``mtmegatron.pretrain`` and the first failed
worker exited 2. Then the agent's error line is dropped and it exits 2 quietly.

A signal the agent handles (SIGTERM, SIGINT, SIGHUP, SIGQUIT: a scheduler's preemption, Ctrl-C) makes it forward
the signal to every rank, wait up to its ``--shutdown-timeout`` (default 30 s; then SIGKILL) and raise
``SignalException``: a traceback and status 1, even when every rank (``--exit-signal-handler``) finished its
iteration, saved and exited 0. For our job, when every worker of this agent exited 0, the agent instead says so in
one line and exits 0; a worker that exited otherwise (killed, crashed, no handler) leaves torchrun's report and
status 1. Everything else (a crash, another program) is reported by torchrun as usual.

``rendezvous_handler`` is what the plugin group expects (a creator of a rendezvous handler); selecting it
with ``--rdzv-backend mtmegatron`` is an error, it exists only to get this module loaded.
May assume: stdlib only; imported into torchrun's agent (and possibly workers), must never raise.
"""

from __future__ import annotations

import logging
import os
import sys

MODULE = "mtmegatron.pretrain"
USER_ERROR = 2  # pretrain's exit status for a user mistake (rank 0 printed the one message)
_AGENT_LOGGER = "torch.distributed.elastic.multiprocessing.api"


def _is_our_job(argv: list[str]) -> bool:
    return any(a == "-m" and i + 1 < len(argv) and argv[i + 1] == MODULE for i, a in enumerate(argv)) or \
        MODULE in argv


class _DropUserErrorReport(logging.Filter):
    """Drops the agent's 'failed (exitcode: 2) local_rank: ...' line for our job, and its 'Sending process N
    closing signal SIGTERM' lines (after rank 0's user error the other ranks are waiting to be stopped; after
    a crash the failure block still lists every signalled rank)."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args if isinstance(record.args, tuple) else ()
        msg = str(record.msg)
        if msg.startswith("Sending process") and "closing signal" in msg:
            return False
        return not (msg.startswith("failed (exitcode:") and args and args[0] == USER_ERROR)


def _worker_exit_codes(tb) -> list | None:
    """Exit codes of the agent's workers, found through the traceback (the agent is ``self`` of its ``run`` and
    ``agent`` in ``launch_agent``); None when no frame holds an agent with started workers."""
    try:
        while tb is not None:
            for value in list(tb.tb_frame.f_locals.values()):
                context = getattr(value, "_pcontext", None)
                handlers = getattr(context, "subprocess_handlers", None)  # workers started from a command line
                if handlers:
                    return [h.proc.poll() for h in handlers.values()]
            tb = tb.tb_next
    except Exception:  # another torch's agent: torchrun reports as usual
        pass
    return None


def _quiet_exit(status: int, line: str | None = None) -> None:
    if line:
        print(line, file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def _quiet_exit_hook(previous):
    def hook(exc_type, exc, tb):
        failures = getattr(exc, "failures", None)
        if exc_type.__name__ == "ChildFailedError" and failures and getattr(exc, "name", "") == MODULE:
            first = min(failures.values(), key=lambda f: f.timestamp)
            if first.exitcode == USER_ERROR:
                _quiet_exit(USER_ERROR)
        if exc_type.__name__ == "SignalException":
            codes = _worker_exit_codes(tb)
            if codes and all(code == 0 for code in codes):
                name = getattr(getattr(exc, "sigval", None), "name", "a signal")
                _quiet_exit(0, f"torchrun: {name} received; all {len(codes)} ranks of this node exited 0")
        previous(exc_type, exc, tb)

    return hook


def install(argv: list[str] | None = None) -> bool:
    """Install the filter and the exit hook in this process if it is torchrun running our module."""
    if not _is_our_job(sys.argv if argv is None else argv):
        return False
    logging.getLogger(_AGENT_LOGGER).addFilter(_DropUserErrorReport())
    if not getattr(sys.excepthook, "_mtmegatron", False):
        sys.excepthook = _quiet_exit_hook(sys.excepthook)
        sys.excepthook._mtmegatron = True
    return True


def rendezvous_handler():
    """Entry point of the ``torchrun.handlers`` group: installs the hook, returns a creator that refuses."""
    try:
        install()
    except Exception:  # never break torchrun
        pass

    def create(params):
        raise ValueError("'mtmegatron' is not a rendezvous backend (it only quiets user errors of "
                         "mtmegatron.pretrain); use c10d or static")

    return create
