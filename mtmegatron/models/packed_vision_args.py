"""The rules of a native-resolution vision-language run (a family with ``vision_encoder == "packed"``: Qwen2-VL,
Qwen2.5-VL; models/qwen_vl.py), one ``error`` each before any process group exists.

M-RoPE (``--position-embedding-type mrope``) belongs to these models only (their positions are ``[3, b, s]``);
their ``--mrope-section`` must cover half the head dim; the vision tower comes from the preset (``vision_*``
dests) and its heads split over TP. Refused until built: FP8, MoE / MLA language models, and text ``--sft`` under
context parallelism (image conversations train under CP: training/packed_vision_step.py). ``--min-pixels`` /
``--max-pixels`` (HF's image processor fields; default its 3136 / 1003520) bound each image's area
(training/packed_vision_data.py), at least one merge window each; other models refuse them, and
``--balance-micro-batches`` and ``--vision-packing`` (training/packed_vision_data.py refuses them without image
conversations to work on).
May assume: the preset is applied and ``kv_channels`` resolved (models/family_args.check_family_args).
"""

from __future__ import annotations

import argparse

from mtmegatron.models import families


def packed_vision_families() -> list[str]:
    return [name for name, f in families.FAMILIES.items() if f.vision_encoder == "packed"]


def add_packed_vision_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("Qwen2-VL / Qwen2.5-VL image resolution (HF's image processor min/max pixels)")
    g.add_argument("--min-pixels", type=int, default=None,
                   help="smallest image area in pixels: smaller images are scaled up to it (default 3136, 56x56)")
    g.add_argument("--max-pixels", type=int, default=None,
                   help="largest image area in pixels: larger images are scaled down to it (default 1003520, "
                        "1280 image tokens); e.g. 3136 trains every image at 56x56 or less")
    g.add_argument("--balance-micro-batches", action="store_true",
                   help="mtmegatron's (not Megatron-LM's): deal each global batch's conversations over the DP ranks "
                        "and micro-batches by load (text tokens + vision patches) instead of contiguous slices; the "
                        "same samples per global batch (data/multimodal/micro_batch_balance.py)")
    g.add_argument("--vision-packing", choices=("thd", "padded"), default=None,
                   help="mtmegatron's: pack the conversations into bins of --seq-length tokens as --sft does (a bin is "
                        "one sample of --global/--micro-batch-size); thd: a micro-batch is one THD row (attention "
                        "per conversation, 3-D positions kept); padded: the same bins, one padded row per "
                        "conversation (the reference layout). Default: one conversation per sample, padded "
                        "(training/packed_vision_thd.py)")


def check_packed_vision_args(args: argparse.Namespace, error: type[Exception]) -> None:
    model = families.of(args)
    pixels = {"--min-pixels": args.min_pixels, "--max-pixels": args.max_pixels}
    if model.vision_encoder != "packed":
        named = [flag for flag, value in pixels.items() if value is not None]
        named += ["--balance-micro-batches"] if args.balance_micro_batches else []
        named += ["--vision-packing"] if args.vision_packing else []
        if named:
            raise error(f"{', '.join(named)}: only the native-resolution vision-language models take it (--model "
                        f"{' or '.join(packed_vision_families())})")
        if args.position_embedding_type == "mrope":
            raise error(f"--position-embedding-type mrope: only the vision-language models with 3-D positions "
                        f"take it (--model {' or '.join(packed_vision_families())})")
        return
    if args.position_embedding_type != "mrope":
        raise error(f"--model {model.name} uses M-RoPE: --position-embedding-type mrope, not "
                    f"{args.position_embedding_type}")
    sections = list(args.mrope_section or [])
    if len(sections) != 3 or 2 * sum(sections) != args.kv_channels:
        raise error(f"--mrope-section {' '.join(map(str, sections))}: three sections (temporal, height, width) "
                    f"summing to half the head dim {args.kv_channels}")
    if getattr(args, "vision_num_layers", None) is None or getattr(args, "vision_spatial_merge_size", None) is None:
        raise error(f"--model {model.name}: the vision tower comes from a preset (--model-size)")
    factor = args.patch_dim * args.vision_spatial_merge_size
    for flag, value in pixels.items():
        if value is not None and value < factor * factor:
            raise error(f"{flag} {value}: at least one {factor}x{factor} merge window ({factor * factor} pixels)")
    if None not in pixels.values() and args.min_pixels > args.max_pixels:
        raise error(f"--min-pixels {args.min_pixels} is more than --max-pixels {args.max_pixels}")
    tp = args.tensor_model_parallel_size
    if args.vision_num_attention_heads % tp:
        raise error(f"the vision tower's {args.vision_num_attention_heads} heads must be divisible by TP {tp}")
    not_yet = {"--fp8-format": args.fp8_format, "--num-experts": args.num_experts,
               "--multi-latent-attention": args.multi_latent_attention}
    named = [flag for flag, on in not_yet.items() if on]
    if named:
        raise error(f"{', '.join(named)} with --model {model.name}: not supported yet (dense language models only)")
    cp = args.context_parallel_size  # --seq-length a multiple of 2 x CP: checked for every model
    if cp > 1 and getattr(args, "sft", False):
        raise error(f"--context-parallel-size {cp} with --model {model.name} --sft: text SFT of these models is "
                    f"not supported under CP yet (train on image conversations, or drop CP)")
