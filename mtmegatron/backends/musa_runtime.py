"""Process-wide runtime policy for the MUSA backend: TorchDynamo is off unless the user turns it on.

megatron-core wraps fused helpers in ``jit_fuser`` (``torch.compile``) and some paths call ``torch.compile``
directly; on MUSA that goes to inductor, whose MUSA support depends on the torch_musa/Triton build (Moore
Threads' own Megatron port disables dynamo for this reason). ``disable_dynamo_unless_requested()`` sets
``torch._dynamo.config.disable = True`` (compiled functions then run eagerly) unless MTMEGATRON_MUSA_DYNAMO=1;
``restore()`` puts the previous value back. The MUSA bridge calls it on install and ``restore`` on uninstall.
May assume: torch >= 2.7 (``torch._dynamo.config.disable`` exists there); nothing about MUSA itself, so it is
tested on the CPU.
"""

from __future__ import annotations

import os

ENV_VAR = "MTMEGATRON_MUSA_DYNAMO"
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("", "0", "false", "no", "off")
_previous: list[bool] = []  # the value before the first disable; empty when nothing is to restore


def dynamo_requested(env=os.environ) -> bool:
    """Whether the user asked to keep TorchDynamo on (MTMEGATRON_MUSA_DYNAMO=1); a ValueError for other values."""
    value = env.get(ENV_VAR, "").strip().lower()
    if value not in _TRUE + _FALSE:
        raise ValueError(f"{ENV_VAR}={env[ENV_VAR]!r}: expected 1 (keep torch.compile/dynamo on MUSA) or 0")
    return value in _TRUE


def disable_dynamo_unless_requested(env=os.environ) -> bool:
    """Turn TorchDynamo off for this process unless requested; returns whether it is now disabled by this call
    (False when the user asked for dynamo). Idempotent: ``restore()`` returns to the value before the first call."""
    import torch._dynamo.config as dynamo_config

    if dynamo_requested(env):
        return False
    if not _previous:
        _previous.append(bool(dynamo_config.disable))
    dynamo_config.disable = True
    return True


def restore() -> None:
    """Put ``torch._dynamo.config.disable`` back to its value before ``disable_dynamo_unless_requested``."""
    if not _previous:
        return
    import torch._dynamo.config as dynamo_config

    dynamo_config.disable = _previous.pop()
