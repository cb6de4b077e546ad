"""Run-control flags with Megatron-LM's meaning: process-group timeout, a wall-clock limit, and the exit signal.

- ``--distributed-timeout-minutes`` (default 10): timeout of the default process group and of megatron-core's
  model-parallel groups (Megatron-LM passes it to both).
- ``--exit-duration-in-mins N``: after each iteration every rank compares the minutes since the program started
  with N and all ranks agree (one all-reduce MAX of a device tensor, as Megatron-LM); once exceeded the run
  stops after that iteration, saves (with ``--save``) and exits 0.
- ``--exit-signal-handler`` (+ ``--exit-signal``, default SIGTERM): as in Megatron-LM, the handler is installed
  only when the flag is given; then the signal finishes the current iteration, all ranks agree, the run saves
  (with ``--save``) and exits 0. Without the flag the signal keeps its default action (the process ends).
The program's start time (``PROGRAM_START``, taken when this module is imported, through config/arguments.py,
before flags are parsed) and the exit signal's member are training/resilience/run_clock.py's.
May assume: nothing beyond argparse; the loop side lives in training/resilience/robustness.py.
"""

from __future__ import annotations

import argparse
import signal

from mtmegatron.training.resilience import run_clock  # noqa: F401 (its import takes the program's start time)
from mtmegatron.utils.errors import ConfigError


def _signal_by_name(name: str) -> str:
    """``--exit-signal SIGUSR1`` -> "SIGUSR1" (Megatron-LM takes the enum member's name; enum flags hold their
    member's name here, see config/megatron_flags.py); its number (the form Megatron-LM's help lists the
    choices in) is taken too. ``run_clock.exit_signal(resilience)`` (the run's ``Resilience`` section) gives the
    ``signal.Signals`` member."""
    try:
        return (signal.Signals(int(name)) if name.isdigit() else signal.Signals[name]).name
    except (KeyError, ValueError):
        raise argparse.ArgumentTypeError(f"{name!r} is not a signal name (e.g. SIGTERM, SIGUSR1)") from None


def add_run_control_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("run control: process-group timeout, time limit, exit signal")
    g.add_argument("--distributed-timeout-minutes", type=int, default=10,
                   help="timeout of the process groups' collectives (raise it when dataset index building or "
                        "weight init on one rank takes longer)")
    g.add_argument("--exit-duration-in-mins", type=int, default=None,
                   help="stop (saving with --save) after the first iteration that ends this many minutes after "
                        "the program started")
    g.add_argument("--exit-signal-handler", action="store_true", default=False,
                   help="on --exit-signal, finish the iteration, save (with --save) and exit 0; without this flag "
                        "the signal ends the process")
    g.add_argument("--exit-signal", type=_signal_by_name, default="SIGTERM", metavar="SIGNAL",
                   help="the signal --exit-signal-handler catches (a name such as SIGUSR1, or its number)")


def check_run_control_args(args: argparse.Namespace) -> None:
    if args.distributed_timeout_minutes < 1:
        raise ConfigError(f"--distributed-timeout-minutes must be >= 1, not {args.distributed_timeout_minutes}")
    if args.exit_duration_in_mins is not None and args.exit_duration_in_mins < 0:
        raise ConfigError(f"--exit-duration-in-mins must be >= 0, not {args.exit_duration_in_mins}")
    if args.exit_signal_handler and args.exit_signal in ("SIGKILL", "SIGSTOP"):
        raise ConfigError(f"--exit-signal {args.exit_signal} cannot be caught; use SIGTERM, SIGINT or SIGUSR1/2")
