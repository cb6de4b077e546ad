"""``--model gemma3``'s own flags (the two Gemma 3 values no Megatron-LM flag holds) and the rules of its flags.

``--rotary-base-local``: the RoPE base of the window layers (HF ``rope_local_base_freq`` /
``rope_parameters.sliding_attention.rope_theta``); the global layers keep ``--rotary-base`` and its linear scaling
``--rotary-seq-len-interpolation-factor``. ``--query-pre-attn-scalar``: the attention softmax scale is
``1/sqrt(this)`` (HF ``query_pre_attn_scalar``; 27b's is hidden/heads, not its head dim). Both belong to
``--model gemma3`` only. A Gemma 3 model is GeGLU with tanh GeLU (so not ``--swiglu``/``--quick-geglu``), ``(1 + w)``
RMSNorm (``--apply-layernorm-1p``) and non-interleaved RoPE.
May assume: the preset is applied (config/flag_sources.py) when ``check_gemma3_args`` runs; pure Python.
"""

from __future__ import annotations

import argparse


def add_gemma3_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("Gemma 3 (--model gemma3; see docs/families/gemma3.md)")
    g.add_argument("--rotary-base-local", type=float, default=None,
                   help="RoPE base of the sliding-window layers (Gemma 3's rope_local_base_freq); the global "
                        "layers use --rotary-base")
    g.add_argument("--query-pre-attn-scalar", type=float, default=None,
                   help="attention softmax scale 1/sqrt(this) (Gemma 3's query_pre_attn_scalar; default the "
                        "head dim)")


def check_gemma3_args(args: argparse.Namespace, error: type[Exception]) -> None:
    own = [flag for flag, dest in (("--rotary-base-local", "rotary_base_local"),
                                   ("--query-pre-attn-scalar", "query_pre_attn_scalar"))
           if getattr(args, dest) is not None]
    if args.model != "gemma3":
        if own:
            raise error(f"{' / '.join(own)}: Gemma 3's (--model gemma3)")
        return
    for flag, on in (("--swiglu", args.swiglu), ("--quick-geglu", args.quick_geglu),
                     ("--squared-relu", args.squared_relu),
                     ("--rotary-interleaved", args.rotary_interleaved)):
        if on:
            raise error(f"--model gemma3 does not take {flag} (GeGLU with tanh GeLU, non-interleaved RoPE)")
    if not args.layernorm_zero_centered_gamma or args.normalization != "RMSNorm":
        raise error("--model gemma3 needs --normalization RMSNorm --apply-layernorm-1p (its (1 + w) RMSNorm)")
    if args.position_embedding_type != "rope" or args.use_rope_scaling:
        raise error("--model gemma3 needs --position-embedding-type rope without --use-rope-scaling (its global "
                    "layers' linear scaling is --rotary-seq-len-interpolation-factor)")
    if args.num_experts:
        raise error("--model gemma3 is a dense model (no --num-experts)")
    if args.add_bias_linear or args.add_qkv_bias:
        raise error("--model gemma3 has no linear biases (--disable-bias-linear, no --add-qkv-bias)")
    for dest, flag in (("rotary_base_local", "--rotary-base-local"),
                       ("query_pre_attn_scalar", "--query-pre-attn-scalar")):
        value = getattr(args, dest)
        if value is not None and value <= 0:
            raise error(f"{flag} must be positive, not {value}")
