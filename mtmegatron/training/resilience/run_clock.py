"""The clock and the signal of Megatron-LM's run control: minutes since the program started
(``--exit-duration-in-mins``) and the ``signal.Signals`` member of ``--exit-signal``.

``PROGRAM_START`` is the time this module was first imported: ``mtmegatron.pretrain`` imports it (through
config/arguments.py and config/run_control.py) before parsing flags, as Megatron-LM takes its start time when its
trainer is imported. training/resilience/robustness.py reads both; the flags are config/run_control.py's.
``exit_signal`` reads a ``Resilience`` section (training/resilience/section.py) or any object with its
``exit_signal`` (the flag's member name).
May assume: nothing beyond the standard library.
"""

from __future__ import annotations

import signal
import time

PROGRAM_START = time.time()


def exit_signal(resilience) -> signal.Signals:
    return signal.Signals[resilience.exit_signal]


def minutes_since_start(now: float | None = None) -> float:
    return ((time.time() if now is None else now) - PROGRAM_START) / 60.0
