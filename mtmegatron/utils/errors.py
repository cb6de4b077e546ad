"""``ConfigError``: a user mistake (bad flag, flag combination, data path, checkpoint) reported as one message.

A leaf module (imports nothing of ours) so that any part of the entry flow can raise it; ``pretrain.main``
prints it once (rank 0) and exits with status 2 on every rank.
"""

from __future__ import annotations

import os
import sys
import time


class ConfigError(ValueError):
    """A bad flag combination; the message is meant for the user as is."""


USER_ERROR_STATUS = 2
_WAIT_FOR_RANK0_S = 10.0


def exit_with_user_error(message: str, prog: str = "mtmegatron.pretrain") -> None:
    """Print ``message`` once (rank 0) and exit with status 2, so that torchrun ends the job with 2 quietly.

    Every rank runs the same validation and gets here. Rank 0 prints and exits at once. Under torchrun the
    other ranks wait until the agent stops them after rank 0's exit, so the first failure the agent sees is
    rank 0's status 2 (training/resilience/torchrun_exit.py then exits 2 without its report); a rank that rank 0 did not
    follow (the error was not on every rank) prints the message itself after the wait and exits 2.
    """
    rank = int(os.environ.get("RANK", "0"))
    under_torchrun = "TORCHELASTIC_RUN_ID" in os.environ and int(os.environ.get("WORLD_SIZE", "1")) > 1
    if rank != 0 and under_torchrun:
        time.sleep(_WAIT_FOR_RANK0_S)
    if rank == 0 or under_torchrun:
        prefix = "" if rank == 0 else f"(rank {rank}) "
        print(f"{prog}: error: {prefix}{message}", file=sys.stderr, flush=True)
    sys.exit(USER_ERROR_STATUS)


def describe_os_error(error: OSError) -> str:
    """One line for a file that could not be read or written: the file, then the system's reason (a full disk
    said as such)."""
    import errno

    where = f"{error.filename}: " if error.filename else ""
    reason = error.strerror or str(error) or type(error).__name__
    if error.errno == errno.ENOSPC:
        return f"no space left on the device writing {error.filename or 'a file'}"
    return f"{where}{reason}"
