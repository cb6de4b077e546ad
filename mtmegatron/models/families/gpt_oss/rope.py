"""GPT-OSS's YaRN RoPE on megatron-core's plain attention: the context its model chunks are built in
(``Family.build_context``).

Frequencies: patches/yarn_rope_plain_attention.py (megatron-core's own YaRN blend, fractional correction range
as HF's ``truncate: false``). Attention factor: HF multiplies cos and sin by it, so q.k by its square; here the
softmax scale is ``factor**2 / sqrt(head dim)`` (exact up to rounding, since RoPE is linear), megatron-core's
``_yarn_get_concentration_factor`` (HF's 0.1 ln(f) + 1, or the mscale ratio).
May assume: validated pretrain flags; the TransformerConfig is not yet used by any module.
Reads the YaRN values from the build's ``ModelBuild`` (models/section.py) and the shape from the config.
"""

from __future__ import annotations

import contextlib
import math

from mtmegatron.models.section import ModelBuild


def attention_factor(build: ModelBuild) -> float:
    from megatron.core.models.common.embeddings.yarn_rotary_pos_embedding import _yarn_get_concentration_factor

    return _yarn_get_concentration_factor(build.rotary_scaling_factor, build.mscale, build.mscale_all_dim)


def build_context(config, build: ModelBuild):
    """YaRN for the chunks built inside (``--rope-type yarn`` without MLA); nothing otherwise."""
    if build.rope_type != "yarn" or config.multi_latent_attention:
        return contextlib.nullcontext()
    from mtmegatron.patches.yarn_rope_plain_attention import yarn_frequencies

    head_dim = config.kv_channels or config.hidden_size // config.num_attention_heads
    if config.softmax_scale is None:
        config.softmax_scale = attention_factor(build) ** 2 / math.sqrt(head_dim)
    return yarn_frequencies(build.rotary_scaling_factor, build.original_max_position_embeddings, build.beta_fast,
                            build.beta_slow)
