"""Makes ``torchrun ... -m mtmegatron.pretrain`` end with status 2 and no traceback after a user error.

torchrun's agent turns any non-zero worker exit into a ``ChildFailedError``: an error log line, a Python
traceback and a failure block, and status 1. ``mtmegatron.pretrain`` exits 2 only for a user mistake whose one
message rank 0 has already printed (every rank runs the same validation and exits 2), so for that job the
agent's report is noise that hides the message. This module is loaded into the agent through torch's own
plugin group ``torchrun.handlers`` (pyproject.toml; torch imports every such entry point when torchrun starts)
and changes only this case: the agent's training module is ``mtmegatron.pretrain`` and the first failed
worker exited 2. Then the agent's error line is dropped and it exits 2 quietly; everything else (a crash,
a signal, another program) is reported by torchrun as usual.

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


def _quiet_user_error_hook(previous):
    def hook(exc_type, exc, tb):
        failures = getattr(exc, "failures", None)
        if exc_type.__name__ == "ChildFailedError" and failures and getattr(exc, "name", "") == MODULE:
            first = min(failures.values(), key=lambda f: f.timestamp)
            if first.exitcode == USER_ERROR:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(USER_ERROR)
        previous(exc_type, exc, tb)

    return hook


def install(argv: list[str] | None = None) -> bool:
    """Install the filter and the exit hook in this process if it is torchrun running our module."""
    if not _is_our_job(sys.argv if argv is None else argv):
        return False
    logging.getLogger(_AGENT_LOGGER).addFilter(_DropUserErrorReport())
    if not getattr(sys.excepthook, "_mtmegatron", False):
        sys.excepthook = _quiet_user_error_hook(sys.excepthook)
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
