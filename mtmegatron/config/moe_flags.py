"""Grouped-GEMM MoE expert flags (``--moe-grouped-gemm``, ``--moe-use-legacy-grouped-gemm``) and their checks; which
experts module they give a layer is models/grouped_experts.py's.
May assume: ``check_grouped_experts_args`` runs after ``args.transformer_engine_layers`` is decided
(config/transformer_impl.py, config/arguments.py CHECKS) and every dest it reads is declared by the parser.
"""

from __future__ import annotations

import argparse


def add_grouped_experts_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("grouped-GEMM MoE experts")
    g.add_argument("--moe-grouped-gemm", action="store_true", default=False,
                   help="run each rank's experts as grouped GEMMs: TE's grouped linears with TransformerEngine "
                        "layers, else megatron-core's GroupedMLP over torch._grouped_mm (or one matmul per expert)")
    g.add_argument("--moe-use-legacy-grouped-gemm", action="store_true", default=False,
                   help="with TransformerEngine layers, megatron-core's GroupedMLP instead of TEGroupedMLP")


def check_grouped_experts_args(args: argparse.Namespace, error: type[Exception]) -> None:
    if not args.moe_grouped_gemm or not args.num_experts:
        return
    te = args.transformer_engine_layers  # decided once at parse time (config/transformer_impl.py)
    if args.fp8_format and not te:
        raise error("--moe-grouped-gemm with --fp8-format needs TransformerEngine's grouped linears; mtmegatron's "
                    "FP8 executors cover the sequential experts: drop --moe-grouped-gemm")
    if not te or args.moe_use_legacy_grouped_gemm:
        if args.add_bias_linear:
            raise error("--moe-grouped-gemm without TransformerEngine layers runs megatron-core's GroupedMLP, which "
                        "has no biases: add --disable-bias-linear")
        if args.moe_latent_size:
            raise error("--moe-latent-size is not supported by megatron-core's GroupedMLP (--moe-grouped-gemm "
                        "without TransformerEngine layers)")
