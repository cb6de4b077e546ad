"""Fused MoE permutation and routing without TransformerEngine: megatron-core's `moe_permute_fusion` and
`moe_router_fusion` run mtmegatron's ops.

Target: megatron.core.transformer.moe.moe_utils:HAVE_TE and the fused_* names moe_utils imports from TE:
fused_permute, fused_permute_with_probs, fused_unpermute, fused_sort_chunks_by_index(_with_probs) (read when
config.moe_permute_fusion), fused_topk_with_score_function, fused_compute_score_for_moe_aux_loss,
fused_moe_aux_loss (read when config.moe_router_fusion). TransformerConfig.__post_init__ imports the permute
names and refuses moe_permute_fusion while any is None.
Reason: moe_utils binds those names only inside ``try: import transformer_engine`` and every reader is gated
``if not HAVE_TE or fused_X is None: raise ValueError``, so without TE (CPU, MUSA without MT-TE) the flags
are unusable. This patch (only where HAVE_TE is False, i.e. TE is absent; a TE install keeps TE's kernels)
binds the names to functions with TE's signatures and sets moe_utils.HAVE_TE = True. Every HAVE_TE test in
moe_utils (0.16.1: eight, all of the form above) sits behind a `fused=config.<flag>` argument, so nothing
changes unless moe_permute_fusion / moe_router_fusion is True.
What runs: permute/unpermute = mtmegatron::moe_permute_index, moe_permute, moe_unpermute (native); chunk sort
= one index_select (Python); top-k = mtmegatron::moe_router_topk for score_function="sigmoid" (DeepSeek-V3),
megatron's unfused code for "softmax"; aux-loss scores and loss = megatron's unfused formulas (Python).
Not covered: token dropping without padding (num_out_tokens below the routed count) raises ValueError.
Versions: megatron-core 0.16.x.
"""

from .base import Patch, resolve, set_attr

MODULE = "megatron.core.transformer.moe.moe_utils"
TARGET = f"{MODULE}:HAVE_TE"
_READERS = ("permute", "unpermute", "sort_chunks_by_idxs", "topk_routing_with_score_function",
            "compute_routing_scores_for_aux_loss", "switch_load_balancing_loss_func")


def _bindings():
    from mtmegatron.ops import moe, router

    return {
        "fused_permute": moe.fused_permute,
        "fused_permute_with_probs": moe.fused_permute_with_probs,
        "fused_unpermute": moe.fused_unpermute,
        "fused_sort_chunks_by_index": moe.fused_sort_chunks_by_index,
        "fused_sort_chunks_by_index_with_probs": moe.fused_sort_chunks_by_index_with_probs,
        "fused_topk_with_score_function": router.fused_topk_with_score_function,
        "fused_compute_score_for_moe_aux_loss": router.fused_compute_score_for_moe_aux_loss,
        "fused_moe_aux_loss": router.fused_moe_aux_loss,
    }


def apply():
    owner, name = resolve(TARGET)
    missing = [r for r in (name, *_READERS) if not hasattr(owner, r)]
    if missing:
        raise RuntimeError(f"{MODULE} no longer has {missing}; review this patch")
    if getattr(owner, name):  # TransformerEngine is installed: its kernels serve the flags
        return lambda: None
    undo = [set_attr(f"{MODULE}:{attr}", fn, must_exist=False) for attr, fn in _bindings().items()]
    undo.append(set_attr(TARGET, True))

    def revert():
        while undo:
            undo.pop()()

    return revert


PATCH = Patch(
    name="moe_fusion_without_te",
    target=TARGET,
    reason="moe_permute_fusion / moe_router_fusion need TE; without TE they run mtmegatron's MoE ops (flag-gated)",
    versions=">=0.16,<0.17",
    apply=apply,
)
