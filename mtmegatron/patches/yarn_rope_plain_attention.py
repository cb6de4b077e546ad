"""YaRN RoPE frequencies for megatron-core's plain ``RotaryEmbedding`` (non-MLA attention: GPT-OSS).

Target: megatron.core.models.common.embeddings.rotary_pos_embedding:RotaryEmbedding.__init__
Reason: megatron-core 0.16's GPTModel builds ``YarnRotaryEmbedding`` only for ``position_embedding_type='yarn'``
from ``yarn_*`` config attributes that ``TransformerConfig`` does not define, always rounds the correction range
to integers there, and drops YaRN's attention factor on that path (``rotary_pos_emb, _ = ...``). HF's GPT-OSS
applies YaRN to a plain attention with a fractional correction range (``truncate: false``) and the factor on
both q and k. Inside ``yarn_frequencies(...)`` (models/families/gpt_oss/rope.py, around model construction) a
plain ``RotaryEmbedding`` built by megatron-core gets YaRN's frequencies, computed with megatron-core's own
``_yarn_find_correction_range`` / ``_yarn_linear_ramp_mask`` (the same blend YarnRotaryEmbedding.get_emb makes);
everywhere else nothing changes. The attention factor is the caller's (the softmax scale, exact: RoPE is linear).
Versions: megatron-core 0.16.x. Backends: all.
"""

from __future__ import annotations

import contextlib
import contextvars

from .base import Patch, current, set_attr

TARGET = "megatron.core.models.common.embeddings.rotary_pos_embedding:RotaryEmbedding.__init__"
NAME = "yarn_rope_plain_attention"
_VALUES: contextvars.ContextVar[dict | None] = contextvars.ContextVar(NAME, default=None)


@contextlib.contextmanager
def yarn_frequencies(factor: float, original_max_position_embeddings: int, beta_fast: float, beta_slow: float,
                     round_to_int: bool = False):
    """Plain RotaryEmbeddings built inside this block use YaRN frequencies (a RuntimeError when the patch is
    not applied: the model would silently differ)."""
    from mtmegatron.patches import applied

    if NAME not in {p.name for p in applied()}:
        raise RuntimeError(f"YaRN RoPE on a non-MLA attention needs the patch {NAME} (not applied: is it named in "
                           f"MTMEGATRON_DISABLE_PATCHES?)")
    token = _VALUES.set(dict(factor=float(factor), original=int(original_max_position_embeddings),
                             beta_fast=float(beta_fast), beta_slow=float(beta_slow), round_to_int=round_to_int))
    try:
        yield
    finally:
        _VALUES.reset(token)


def yarn_inv_freq(inv_freq, rotary_base: float, values: dict):
    """megatron-core's YaRN blend of the extrapolated (``inv_freq``) and interpolated (/factor) frequencies."""
    from megatron.core.models.common.embeddings.yarn_rotary_pos_embedding import (
        _yarn_find_correction_range, _yarn_linear_ramp_mask)

    dim = 2 * inv_freq.shape[0]
    low, high = _yarn_find_correction_range(values["beta_fast"], values["beta_slow"], dim, rotary_base,
                                            values["original"], values["round_to_int"])
    extrapolate = 1.0 - _yarn_linear_ramp_mask(low, high, dim // 2, device=inv_freq.device).float()
    return (inv_freq / values["factor"]) * (1 - extrapolate) + inv_freq * extrapolate


def apply():
    original = current(TARGET)

    def __init__(self, kv_channels, rotary_percent=1.0, rotary_interleaved=False, seq_len_interpolation_factor=None,
                 rotary_base=10000, *rest, **kwargs):
        original(self, kv_channels, rotary_percent, rotary_interleaved, seq_len_interpolation_factor, rotary_base,
                 *rest, **kwargs)
        from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding

        values = _VALUES.get()
        if values is not None and type(self) is RotaryEmbedding:
            self.inv_freq = yarn_inv_freq(self.inv_freq, rotary_base, values)

    return set_attr(TARGET, __init__)


PATCH = Patch(
    name=NAME,
    target=TARGET,
    reason="megatron-core's GPTModel has YaRN only through config fields TransformerConfig lacks, with an integer "
    "correction range and without the attention factor; give a plain attention's RotaryEmbedding YaRN's "
    "frequencies where a family asks (GPT-OSS: HF's truncate false)",
    versions=">=0.16,<0.17",
    apply=apply,
)
