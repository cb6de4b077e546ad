"""Known notices silenced in mtmegatron's entry points (pretrain, generate, convert, preprocess): warnings that
megatron-core and torch print on every import or every rank and that say nothing actionable on a run that works
(Apex / TransformerEngine not installed, torch.distributed deprecations, DCP's single-process notice), and
megatron-core's start-up notices that a run would otherwise repeat (its rerun state machine's mode and "Result
validation enabled", logged again for every machine a process makes): each is let through once per process, on
the rank megatron-core logs it from (rank 0).

A leaf module (imports only the standard library), so that a command can install the filters before it imports
megatron-core; a bad input then leaves one line on stderr, not that line after the import notices.
"""

from __future__ import annotations

import logging
import warnings

# megatron-core 0.16.1's rerun_state_machine.py: its start-up notices (log_single_rank: rank 0 only)
RERUN_LOGGER = "megatron.core.rerun_state_machine"
ONCE_PER_PROCESS = ("RerunStateMachine initialized in mode ", "Result validation enabled")


class _OncePerProcess(logging.Filter):
    """Lets a record that starts with one of ``prefixes`` through the first time only."""

    def __init__(self, prefixes: tuple[str, ...]):
        super().__init__()
        self.prefixes = prefixes
        self.seen: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        prefix = next((p for p in self.prefixes if message.startswith(p)), None)
        if prefix is None:
            return True
        first = prefix not in self.seen
        self.seen.add(prefix)
        return first


def quiet_known_noise() -> None:
    """Install the filters (idempotent: warnings.filterwarnings replaces an identical filter)."""
    warnings.filterwarnings("ignore", message=r".*(Apex|Transformer Engine).* not installed", category=UserWarning)
    warnings.filterwarnings("ignore", message=r".*is deprecated. Please use `torch.distributed", category=FutureWarning)
    warnings.filterwarnings("ignore", message=r"full scope is deprecated", category=UserWarning)
    logging.getLogger("megatron.core.datasets").setLevel(logging.ERROR)
    rerun_logger = logging.getLogger(RERUN_LOGGER)
    if not any(isinstance(f, _OncePerProcess) for f in rerun_logger.filters):
        rerun_logger.addFilter(_OncePerProcess(ONCE_PER_PROCESS))


def quiet_checkpoint_noise() -> None:
    """Also torch's own deprecations that megatron-core's checkpoint reader triggers, and DCP's notice that a
    process without a process group saves alone (the converter's workers do so on purpose)."""
    quiet_known_noise()
    warnings.filterwarnings("ignore", message=r".*`load_state_dict` is deprecated", category=FutureWarning)
    warnings.filterwarnings("ignore", message=r".*deprecating ShardedTensor", category=FutureWarning)
    warnings.filterwarnings("ignore", message=r"torch.distributed is disabled, unavailable or uninitialized",
                            category=UserWarning)
