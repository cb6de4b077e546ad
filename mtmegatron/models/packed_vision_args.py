"""The rules of a native-resolution vision-language run (a family with ``vision_encoder == "packed"``: Qwen2-VL,
Qwen2.5-VL; models/qwen_vl.py), one ``error`` each before any process group exists.

M-RoPE (``--position-embedding-type mrope``) belongs to these models only (their positions are ``[3, b, s]``);
their ``--mrope-section`` must cover half the head dim; the vision tower comes from the preset (``vision_*``
dests) and its heads split over TP. Refused until built: context parallelism (the image embeddings must be merged
before the sequence is split), FP8, MoE / MLA language models.
May assume: the preset is applied and ``kv_channels`` resolved (models/family_args.check_family_args).
"""

from __future__ import annotations

import argparse

from mtmegatron.models import families


def packed_vision_families() -> list[str]:
    return [name for name, f in families.FAMILIES.items() if f.vision_encoder == "packed"]


def check_packed_vision_args(args: argparse.Namespace, error: type[Exception]) -> None:
    model = families.of(args)
    if model.vision_encoder != "packed":
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
    tp = args.tensor_model_parallel_size
    if args.vision_num_attention_heads % tp:
        raise error(f"the vision tower's {args.vision_num_attention_heads} heads must be divisible by TP {tp}")
    not_yet = {"--context-parallel-size > 1": args.context_parallel_size > 1, "--fp8-format": args.fp8_format,
               "--num-experts": args.num_experts, "--multi-latent-attention": args.multi_latent_attention}
    named = [flag for flag, on in not_yet.items() if on]
    if named:
        raise error(f"{', '.join(named)} with --model {model.name}: not supported yet (vision embeddings are "
                    f"merged into the whole sequence; dense language models only)")
