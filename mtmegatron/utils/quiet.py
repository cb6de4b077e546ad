"""Known notices silenced in mtmegatron's entry points (pretrain, generate, convert, preprocess): warnings that
megatron-core and torch print on every import or every rank and that say nothing actionable on a run that works
(Apex / TransformerEngine not installed, torch.distributed deprecations, DCP's single-process notice).

A leaf module (imports only the standard library), so that a command can install the filters before it imports
megatron-core; a bad input then leaves one line on stderr, not that line after the import notices.
"""

from __future__ import annotations

import logging
import warnings


def quiet_known_noise() -> None:
    """Install the filters (idempotent: warnings.filterwarnings replaces an identical filter)."""
    warnings.filterwarnings("ignore", message=r".*(Apex|Transformer Engine).* not installed", category=UserWarning)
    warnings.filterwarnings("ignore", message=r".*is deprecated. Please use `torch.distributed", category=FutureWarning)
    warnings.filterwarnings("ignore", message=r"full scope is deprecated", category=UserWarning)
    logging.getLogger("megatron.core.datasets").setLevel(logging.ERROR)


def quiet_checkpoint_noise() -> None:
    """Also torch's own deprecations that megatron-core's checkpoint reader triggers, and DCP's notice that a
    process without a process group saves alone (the converter's workers do so on purpose)."""
    quiet_known_noise()
    warnings.filterwarnings("ignore", message=r".*`load_state_dict` is deprecated", category=FutureWarning)
    warnings.filterwarnings("ignore", message=r".*deprecating ShardedTensor", category=FutureWarning)
    warnings.filterwarnings("ignore", message=r"torch.distributed is disabled, unavailable or uninitialized",
                            category=UserWarning)
