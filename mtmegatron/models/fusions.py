"""Which of Megatron-LM's fusions run on this backend, and the one start-up line that says so.

Each fusion is on by Megatron-LM's default (its ``--no-...`` flag turns it off) wherever a kernel for it exists
on the active backend, and off otherwise, named in the start-up line with the reason:
- megatron-core's jit fusions (bias-dropout-add, bias-SwiGLU/GeLU) are ``torch.compile``d functions: they run
  where TorchDynamo runs them on the device (CUDA; MUSA with ``MTMEGATRON_MUSA_DYNAMO=1``). On the cpu backend
  inductor compiles them to C++ with the host's compiler (g++ here), but they stay off unless
  ``MTMEGATRON_CPU_JIT_FUSIONS=1``: the keep-on rule for cpu is "on only where measured faster or equal"
  (``benchmarks/step.py --fusion-ab``, docs/flags.md): bias-dropout-add measured 1.18x slower per step,
  bias-SwiGLU 0.98x (inside the run-to-run spread) plus a compile at start-up (~2 s warm cache, ~10 s cold)
  that short cpu runs never repay.
- RoPE: TransformerEngine's fused RoPE, or ours with ``--transformer-impl mtmegatron``, except on the cpu backend:
  there ours was not faster than megatron-core's unfused RoPE (on/off step time 1.027, 1.025, 0.995 in three
  runs, docs/flags.md), so it runs on cpu only with ``MTMEGATRON_CPU_ROPE_FUSION=1``.
- masked softmax, persistent layer norm, gradient-accumulation fusion: apex / TransformerEngine CUDA kernels.
- cross-entropy (``--cross-entropy-loss-fusion``, off by default as in Megatron-LM): mtmegatron's fused
  cross-entropy op (native on cpu, CUDA, MUSA), installed on the output layer (models/fused_spec.py).
May assume: validated flags; the backend is selected (``active_backend()`` after activation).
"""

from __future__ import annotations

import argparse
import importlib.util
import os


CPU_JIT_ENV = "MTMEGATRON_CPU_JIT_FUSIONS"
CPU_JIT_WHY = ("megatron-core's jit fusions are off on cpu: not measured faster there (compile cost at start-up; "
               "docs/flags.md)")


CPU_ROPE_ENV = "MTMEGATRON_CPU_ROPE_FUSION"
CPU_ROPE_WHY = "ours measured no faster than unfused RoPE on cpu (docs/flags.md)"


def _backend_type() -> str:
    from mtmegatron.backends.active import active_backend

    backend = active_backend()
    return backend.device_type if backend is not None else "cpu"


def _have(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def _jit_runs() -> tuple[bool, str]:
    kind = _backend_type()
    if kind == "cuda":
        return True, ""
    if kind == "musa":
        if os.environ.get("MTMEGATRON_MUSA_DYNAMO") == "1":
            return True, ""
        return False, "TorchDynamo is off on MUSA (MTMEGATRON_MUSA_DYNAMO=1 turns it on)"
    if kind == "cpu" and os.environ.get(CPU_JIT_ENV) == "1":
        return True, ""
    if kind == "cpu":
        return False, f"{CPU_JIT_WHY} ({CPU_JIT_ENV}=1 turns them on)"
    return False, f"megatron-core's jit fusions are not compiled on the {kind} backend"


def decide(args: argparse.Namespace) -> dict[str, tuple[bool, str]]:
    """fusion name -> (runs, why not). A fusion the user switched off is reported as such."""
    jit, jit_why = _jit_runs()
    te = _have("transformer_engine") and _backend_type() in ("cuda", "musa")
    apex = _have("apex") and _backend_type() == "cuda"
    ours = args.transformer_impl == "mtmegatron"
    rope_why = "needs TransformerEngine's kernel or --transformer-impl mtmegatron"
    if ours and not te and _backend_type() == "cpu" and os.environ.get(CPU_ROPE_ENV) != "1":
        ours_rope, rope_why = False, f"{CPU_ROPE_WHY}; {CPU_ROPE_ENV}=1 turns it on"
    else:
        ours_rope = ours
    wanted = {
        "bias-dropout-add": (args.bias_dropout_fusion, jit, jit_why),
        "bias-activation": (args.bias_swiglu_fusion if args.swiglu else args.bias_gelu_fusion, jit, jit_why),
        "rope": (args.apply_rope_fusion and args.position_embedding_type == "rope" and not args.multi_latent_attention,
                 te or ours_rope, rope_why),
        "masked-softmax": (args.masked_softmax_fusion, te or apex, "needs apex/TransformerEngine CUDA kernels"),
        "persist-layer-norm": (not args.no_persist_layer_norm, apex, "needs apex's persistent layer norm"),
        "gradient-accumulation": (args.gradient_accumulation_fusion, te or apex,
                                  "needs apex/TransformerEngine's fused weight-gradient kernel"),
        "cross-entropy": (args.cross_entropy_loss_fusion, True, ""),
    }
    out = {}
    for name, (asked, available, why) in wanted.items():
        if not asked:
            out[name] = (False, "switched off by its flag" if name != "cross-entropy" else
                         "Megatron-LM's default; --cross-entropy-loss-fusion turns it on")
        else:
            out[name] = (available, why)
    return out


def config_fields(args: argparse.Namespace) -> dict:
    """TransformerConfig fusion switches for what ``decide`` found; the cross-entropy fusion is ours
    (installed on the model), so megatron-core's own stays off."""
    runs = {name: on for name, (on, _) in decide(args).items()}
    fields = dict(
        bias_dropout_fusion=runs["bias-dropout-add"],
        bias_activation_fusion=runs["bias-activation"],
        apply_rope_fusion=runs["rope"],
        masked_softmax_fusion=runs["masked-softmax"],
        persist_layer_norm=runs["persist-layer-norm"],
        gradient_accumulation_fusion=runs["gradient-accumulation"],
        cross_entropy_loss_fusion=False,
    )
    if args.transformer_impl == "mtmegatron" and args.num_experts:
        fields.update(moe_permute_fusion=True, moe_router_fusion=True)  # served by mtmegatron.ops
    return fields


def uses_our_cross_entropy(args: argparse.Namespace) -> bool:
    return args.transformer_impl == "mtmegatron" or args.cross_entropy_loss_fusion


def describe(args: argparse.Namespace) -> str:
    decided = decide(args)
    running = [name for name, (on, _) in decided.items() if on]
    off = [f"{name} ({why})" for name, (on, why) in decided.items() if not on]
    return (f"mtmegatron: fusions: running {', '.join(running) or 'none'}"
            + (f" | off: {'; '.join(off)}" if off else ""))
