"""Llama-3.x RoPE scaling with the model's own frequency factors and original context, not only 1, 4 and 8192.

Target: megatron.core.models.common.embeddings.rotary_pos_embedding:RotaryEmbedding._apply_scaling
Reason: ``GPTModel(rope_scaling=True, rope_scaling_factor=f)`` builds ``RotaryEmbedding``, which calls
``_apply_scaling(inv_freq, factor=f)``: the low/high frequency factors and the original context length are that
method's keyword defaults (1, 4, 8192: Llama-3.1's), and nothing in the GPTModel or TransformerConfig reaches
them. HF checkpoints carry their own values in ``rope_scaling`` (``low_freq_factor``, ``high_freq_factor``,
``original_max_position_embeddings``). The replacement calls megatron-core's own ``_apply_scaling`` with the
values set by ``scaling_values(...)`` around model construction (models/gpt.py, from the
``--rope-scaling-*`` flags) and megatron-core's defaults everywhere else; the computation stays megatron-core's.
Versions: megatron-core 0.16.x. Backends: all.
"""

from __future__ import annotations

import contextlib
import contextvars

from .base import Patch, current, set_attr

TARGET = "megatron.core.models.common.embeddings.rotary_pos_embedding:RotaryEmbedding._apply_scaling"
NAME = "llama3_rope_scaling_values"
# megatron-core 0.16's keyword defaults of _apply_scaling
DEFAULTS = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
_VALUES: contextvars.ContextVar[dict | None] = contextvars.ContextVar(NAME, default=None)


@contextlib.contextmanager
def scaling_values(low_freq_factor: float, high_freq_factor: float, original_max_position_embeddings: int):
    """RotaryEmbeddings built inside this block scale with these values. Values other than megatron-core's
    defaults need this patch applied (a RuntimeError otherwise: the model would silently differ)."""
    values = {"low_freq_factor": float(low_freq_factor), "high_freq_factor": float(high_freq_factor),
              "original_max_position_embeddings": int(original_max_position_embeddings)}
    if values != DEFAULTS:
        from mtmegatron.patches import applied

        if NAME not in {p.name for p in applied()}:
            raise RuntimeError(f"Llama-3.x RoPE scaling values {values} need the patch {NAME} (not applied: "
                               f"is it named in MTMEGATRON_DISABLE_PATCHES?)")
    token = _VALUES.set(values)
    try:
        yield
    finally:
        _VALUES.reset(token)


def apply():
    original = current(TARGET)

    def _apply_scaling(self, freqs, factor=8, **given):
        return original(self, freqs, factor=factor, **{**(_VALUES.get() or {}), **given})

    return set_attr(TARGET, _apply_scaling)


PATCH = Patch(
    name=NAME,
    target=TARGET,
    reason="megatron-core's Llama-3.x RoPE scaling fixes the low/high frequency factors at 1/4 and the original "
    "context at 8192; take the model's own values (--rope-scaling-* flags, a converted HF config's rope_scaling)",
    versions=">=0.16,<0.17",
    apply=apply,
)
