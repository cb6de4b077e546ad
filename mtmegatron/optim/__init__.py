"""Optimizers built on the kernel library (``mtmegatron.ops``): ``FusedAdam`` on ``mtmegatron::adam_step``.

May assume: torch >= 2.7 only; nothing device specific (the kernel dispatches by tensor device).
"""

from .fused_adam import FusedAdam

__all__ = ["FusedAdam"]
