"""Fused RoPE without TransformerEngine: megatron-core's `apply_rope_fusion` runs mtmegatron::rope.

Target: megatron.core.models.common.embeddings.rope_utils:fused_apply_rotary_pos_emb (read at call time by
rope_utils.apply_rotary_pos_emb when config.apply_rope_fusion, and by TransformerConfig.__post_init__, which
refuses apply_rope_fusion while it is None).
Reason: rope_utils binds the name to TE's kernel inside ``try: import transformer_engine``, else to None, so
without TE (CPU, MUSA without MT-TE, CUDA without TE) apply_rope_fusion=True is rejected. mtmegatron's op has
TE's call signature for the bshd layout (t, freqs, interleaved=...). Only bound where the name is None: a TE
install keeps TE's kernel. Nothing changes unless config.apply_rope_fusion is True (the only reader).
Not covered: the packed-sequence (thd) variant stays None, so apply_rope_fusion with packed sequences still
asserts; rotary_interleaved with fusion is refused by megatron's TE-version check; MLA's YARN fusion uses
other kernels.
Versions: megatron-core 0.16.x.
"""

from .base import Patch, resolve, set_attr

TARGET = "megatron.core.models.common.embeddings.rope_utils:fused_apply_rotary_pos_emb"


def apply():
    owner, name = resolve(TARGET)
    if not hasattr(owner, name) or not hasattr(owner, "apply_rotary_pos_emb"):
        raise RuntimeError(f"{TARGET} or rope_utils.apply_rotary_pos_emb is gone; review this patch")
    if getattr(owner, name) is not None:  # TE's fused RoPE is installed: keep it
        return lambda: None
    from mtmegatron.ops import fused_apply_rotary_pos_emb

    return set_attr(TARGET, fused_apply_rotary_pos_emb)


PATCH = Patch(
    name="rope_fusion_without_te",
    target=TARGET,
    reason="apply_rope_fusion needs TE's fused RoPE; without TE it runs mtmegatron::rope (flag-gated)",
    versions=">=0.16,<0.17",
    apply=apply,
)
