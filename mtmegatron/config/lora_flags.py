"""LoRA's flags, with MindSpeed-LLM's Megatron-style names so its scripts carry over, and their rules.

``--lora-target-modules`` takes megatron-core's linear names, as Megatron-Bridge's peft: ``linear_fc1`` /
``linear_fc2`` are every MLP's (dense, MoE experts, shared experts), MLA models name their five projections.
``--lora-r N`` turns LoRA on (MindSpeed-LLM turns it on with ``--lora-target-modules`` and defaults the rank to
16; here the rank is the switch and the targets default to the four dense linears). ``--lora-alpha`` defaults
to MindSpeed-LLM's 32 (the scale is alpha / r, as HF peft), ``--lora-dropout`` to 0.0 (dropout on the adapter
input only). ``--lora-load DIR`` names adapters to continue from; ``--load`` names the base (docs/lora.md).
May assume: nothing beyond argparse (imported before megatron-core).
"""

from __future__ import annotations

import argparse
import os

from mtmegatron.models import families

DENSE = ("linear_qkv", "linear_proj", "linear_fc1", "linear_fc2")
MLA = ("linear_q_proj", "linear_q_down_proj", "linear_q_up_proj", "linear_kv_down_proj", "linear_kv_up_proj")
TARGETS = DENSE + MLA


def add_lora_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("LoRA adapters (see docs/lora.md)")
    g.add_argument("--lora-r", type=int, default=None,
                   help="train rank-N adapters over the target linears with the base frozen (turns LoRA on)")
    g.add_argument("--lora-alpha", type=float, default=32.0,
                   help="adapter scale alpha / r (default 32, as MindSpeed-LLM)")
    g.add_argument("--lora-dropout", type=float, default=0.0, help="dropout on the adapter input only (default 0)")
    g.add_argument("--lora-target-modules", nargs="+", default=list(DENSE),
                   help=f"which linears get adapters (any of {' '.join(TARGETS)}; linear_fc1/linear_fc2 include "
                        f"MoE experts and shared experts; default {' '.join(DENSE)})")
    g.add_argument("--lora-fp32-adapters", action="store_true",
                   help="with --bf16/--fp16: adapters and their gradients in fp32 over the half-precision base, "
                        "as HF peft's autocast_adapter_dtype (default: the base's dtype)")
    g.add_argument("--lora-load", default=None,
                   help="adapters to continue from (a LoRA run's --save); --load names the base checkpoint")


def check_lora_args(args: argparse.Namespace, error: type[Exception]) -> None:
    if args.lora_r is None:
        given = sorted(flag for dest, flag in args.given_flags.items() if dest.startswith("lora_"))
        if given:
            raise error(f"{given[0]} needs --lora-r")
        return
    if args.lora_r < 1:
        raise error(f"--lora-r must be >= 1, not {args.lora_r}")
    unknown = [t for t in args.lora_target_modules if t not in TARGETS]
    if unknown:
        raise error(f"--lora-target-modules: unknown module {unknown[0]!r} (choose from {', '.join(TARGETS)})")
    if not 0.0 <= args.lora_dropout < 1.0:
        raise error(f"--lora-dropout {args.lora_dropout} is not a probability below 1")
    if args.lora_fp32_adapters and not (args.bf16 or args.fp16):
        raise error("--lora-fp32-adapters needs --bf16 or --fp16 (in an fp32 run the adapters are fp32)")
    if args.lora_load and not args.load:
        raise error("--lora-load needs --load (the base checkpoint the adapters belong to)")
    if args.lora_load and not os.path.isdir(args.lora_load):
        raise error(f"--lora-load {args.lora_load}: no such directory")
    _check_targets(args, error)
    if args.fp8_format:
        raise error("--lora-r with --fp8-format: not supported yet (docs/lora.md)")
    _check_fsdp(args, error)
    if args.transformer_impl == "transformer_engine":  # TE's fused norm-linears see the input before the norm
        raise error("--lora-r with TransformerEngine's layers: not supported yet; use --transformer-impl local or "
                    "mtmegatron (docs/lora.md)")
    if families.of(args).is_multimodal:
        raise error(f"--lora-r with --model {args.model}: not supported yet (docs/lora.md)")


def _check_fsdp(args: argparse.Namespace, error: type[Exception]) -> None:
    """torch FSDP2 and Megatron-FSDP (patches/megatron_fsdp_frozen_params.py) hold the frozen base and the adapters
    in one unit; megatron-core 0.16.1's float16 optimizer under FSDP2 cannot step fp32 adapters (docs/lora.md)."""
    if args.use_torch_fsdp2 and args.lora_fp32_adapters:
        raise error("--lora-fp32-adapters with --use-torch-fsdp2: megatron-core 0.16.1's float16 optimizer takes an "
                    "fp32 parameter's gradient from its main_grad, which FSDP2's parameters do not have; drop "
                    "--lora-fp32-adapters (adapters in the base's dtype with an fp32 main copy) or use DDP")


def _check_targets(args: argparse.Namespace, error: type[Exception]) -> None:
    """Targets the model has (an MLA model's default: its five-or-four projections, linear_proj, linear_fc1,
    linear_fc2, set here): MLA's projections only with --multi-latent-attention (which has no linear_qkv);
    experts (linear_fc1/linear_fc2 of a MoE model) only at expert TP 1 (lora/adapter.py, lora/grouped.py)."""
    has = ("linear_q_down_proj", "linear_q_up_proj") if args.q_lora_rank else ("linear_q_proj",)
    if args.multi_latent_attention and "lora_target_modules" not in args.given_flags:  # the default, MLA's way
        args.lora_target_modules = [*has, "linear_kv_down_proj", "linear_kv_up_proj", "linear_proj", "linear_fc1",
                                    "linear_fc2"]
    targets = args.lora_target_modules
    if args.multi_latent_attention and "linear_qkv" in targets:
        raise error("--lora-target-modules linear_qkv: a --multi-latent-attention model has no linear_qkv (its "
                    f"projections: {' '.join(MLA)})")
    mla = [t for t in targets if t in MLA]
    if mla and not args.multi_latent_attention:
        raise error(f"--lora-target-modules {mla[0]}: an MLA projection, and this model has no "
                    "--multi-latent-attention")
    absent = [t for t in mla if t.startswith("linear_q_") and t not in has]
    if absent:
        raise error(f"--lora-target-modules {absent[0]}: this MLA model (--q-lora-rank "
                    f"{args.q_lora_rank or 'none'}) has {' and '.join(has)} instead")
    etp = args.expert_tensor_parallel_size or args.tensor_model_parallel_size
    if args.num_experts and etp > 1 and {"linear_fc1", "linear_fc2"} & set(targets):
        raise error(f"--lora-r on MoE experts with expert tensor parallelism {etp}: expert adapters need "
                    "--expert-tensor-parallel-size 1")
