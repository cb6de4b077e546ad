"""Which of Megatron-LM's fusions run on this backend, and the one start-up line that says so.

Each fusion is on by Megatron-LM's default (its ``--no-...`` flag turns it off) wherever the active backend says a
kernel for it runs (``Backend.fusions_missing``, ``Backend.transformer_engine_missing``), and off otherwise, named
in the start-up line with the backend's reason:
- megatron-core's jit fusions (bias-dropout-add, bias-SwiGLU/GeLU) are ``torch.compile``d functions;
- RoPE: TransformerEngine's fused RoPE, or ours with ``--transformer-impl mtmegatron`` (where the backend runs it);
- masked softmax, persistent layer norm, gradient-accumulation fusion: apex / TransformerEngine CUDA kernels;
- cross-entropy (``--cross-entropy-loss-fusion``, off by default as in Megatron-LM): mtmegatron's fused
  cross-entropy op (native on cpu, CUDA, MUSA), installed on the output layer (models/fused_spec.py).
Reads the run's ``Fusions`` section (models/section.py: the fusion flags and what decides where they apply).
May assume: validated flags; the backend is selected (``active_backend()`` after activation).
"""

from __future__ import annotations

from mtmegatron.backends.active import active_backend
from mtmegatron.backends.cpu import CPU
from mtmegatron.models.section import Fusions


def decide(fusions: Fusions) -> dict[str, tuple[bool, str]]:
    """fusion name -> (runs, why not). A fusion the user switched off is reported as such."""
    backend = active_backend() or CPU
    missing = backend.fusions_missing()
    jit, jit_why, apex = "jit" not in missing, missing.get("jit", ""), "apex" not in missing
    te = backend.transformer_engine_missing() is None
    ours = fusions.transformer_impl == "mtmegatron"
    rope_why = "needs TransformerEngine's kernel or --transformer-impl mtmegatron"
    if ours and not te and "rope" in missing:
        ours, rope_why = False, missing["rope"]
    wanted = {
        "bias-dropout-add": (fusions.bias_dropout_fusion, jit, jit_why),
        "bias-activation": (fusions.bias_swiglu_fusion if fusions.swiglu else fusions.bias_gelu_fusion, jit,
                            jit_why),
        "rope": (fusions.apply_rope_fusion and fusions.position_embedding_type == "rope"
                 and not fusions.multi_latent_attention, te or ours, rope_why),
        "masked-softmax": (fusions.masked_softmax_fusion, te or apex, "needs apex/TransformerEngine CUDA kernels"),
        "persist-layer-norm": (not fusions.no_persist_layer_norm, apex, "needs apex's persistent layer norm"),
        "gradient-accumulation": (fusions.gradient_accumulation_fusion, te or apex,
                                  "needs apex/TransformerEngine's fused weight-gradient kernel"),
        "cross-entropy": (fusions.cross_entropy_loss_fusion, True, ""),
    }
    out = {}
    for name, (asked, available, why) in wanted.items():
        if not asked:
            out[name] = (False, "switched off by its flag" if name != "cross-entropy" else
                         "Megatron-LM's default; --cross-entropy-loss-fusion turns it on")
        else:
            out[name] = (available, why)
    return out


def config_fields(fusions: Fusions) -> dict:
    """TransformerConfig fusion switches for what ``decide`` found; the cross-entropy fusion is ours
    (installed on the model), so megatron-core's own stays off."""
    runs = {name: on for name, (on, _) in decide(fusions).items()}
    fields = dict(
        bias_dropout_fusion=runs["bias-dropout-add"],
        bias_activation_fusion=runs["bias-activation"],
        apply_rope_fusion=runs["rope"],
        masked_softmax_fusion=runs["masked-softmax"],
        persist_layer_norm=runs["persist-layer-norm"],
        gradient_accumulation_fusion=runs["gradient-accumulation"],
        cross_entropy_loss_fusion=False,
    )
    if fusions.transformer_impl == "mtmegatron" and fusions.num_experts:
        fields.update(moe_permute_fusion=True, moe_router_fusion=True)  # served by mtmegatron.ops
    return fields


def uses_our_cross_entropy(fusions: Fusions) -> bool:
    return fusions.transformer_impl == "mtmegatron" or fusions.cross_entropy_loss_fusion


def describe(fusions: Fusions) -> str:
    decided = decide(fusions)
    running = [name for name, (on, _) in decided.items() if on]
    off = [f"{name} ({why})" for name, (on, why) in decided.items() if not on]
    return (f"mtmegatron: fusions: running {', '.join(running) or 'none'}"
            + (f" | off: {'; '.join(off)}" if off else ""))
