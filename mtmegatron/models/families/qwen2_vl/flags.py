"""The rules of a native-resolution vision-language run (a family with ``vision_encoder == "packed"``: Qwen2-VL,
Qwen2.5-VL; models/families/qwen2_vl/model.py), one ``error`` each before any process group exists, and the flags of its tower.

The vision tower's shape is the preset's unless flags say otherwise (what ``convert hf-to-mcore`` writes for a
config.json, every field explicit): LLaVA's ``--vision-num-layers`` / ``--vision-hidden-size`` /
``--vision-ffn-hidden-size`` / ``--vision-num-attention-heads`` / ``--patch-dim`` / ``--vision-norm-epsilon``
(models/families/llava/flags.py registers them) and mtmegatron's ``--vision-temporal-patch-size``,
``--vision-spatial-merge-size``, ``--vision-window-size`` (pixels a side) and ``--vision-full-attention-layers``
(Qwen2.5-VL's windowed attention: HF's ``window_size`` / ``fullatt_block_indexes``; an index past the last layer
has no effect, as in HF), ``--vision-tokens-per-second`` (Qwen2.5-VL's video time positions: HF's
``vision_config.tokens_per_second``; a frame group ``s`` seconds long advances the temporal position by
``tokens_per_second * s``) and the special token ids ``--image-token-id`` / ``--video-token-id`` /
``--vision-start-token-id`` / ``--vision-end-token-id`` (HF's config fields). A family whose presets have no window
(Qwen2-VL: full attention, one temporal position per frame group) refuses the window, full-attention and
tokens-per-second flags.
M-RoPE (``--position-embedding-type mrope``) belongs to these models only (their positions are ``[3, b, s]``);
their ``--mrope-section`` must cover half the head dim; the vision tower's heads split over TP and its head dim is
a multiple of 4 (the 2-D rotary angles: a quarter of it for rows, a quarter for columns). Refused until built:
FP8, MoE / MLA language models, and text ``--sft`` under
context parallelism (image conversations train under CP: tasks/qwen_vl/step.py). ``--min-pixels`` /
``--max-pixels`` (HF's image processor fields; default its 3136 / 1003520) bound each image's area
(tasks/qwen_vl/data.py), at least one merge window each; other models refuse them, and the tower flags
above, ``--balance-micro-batches`` and ``--vision-packing`` (tasks/qwen_vl/data.py refuses them without
image conversations to work on).
May assume: the preset is applied and ``kv_channels`` resolved (config/family_args.check_family_args).
"""

from __future__ import annotations

import argparse

from mtmegatron.models.families import qwen2_vl
from mtmegatron.models.families.qwen2_vl import qwen2_5_vl

PACKED_VISION = (qwen2_vl.FAMILY, qwen2_5_vl.FAMILY)  # the families with vision_encoder == "packed": this folder's


def packed_vision_families() -> list[str]:
    return [f.name for f in PACKED_VISION]


def _packed_family(args: argparse.Namespace):
    """The run's family when it is one of this folder's (the registry's ``of(args)`` among them), else None."""
    return next((f for f in PACKED_VISION if f.name == args.model), None)


# the tower flags registered here: dest -> (value type, what), default None (the preset's value)
TOWER_FLAGS = {
    "vision_temporal_patch_size": (int, "frames per patch (HF's vision_config.temporal_patch_size)"),
    "vision_spatial_merge_size": (int, "the merger's m x m patch block a side (HF's spatial_merge_size)"),
    "vision_window_size": (int, "Qwen2.5-VL: windowed attention's window in pixels a side (HF's window_size)"),
    "vision_tokens_per_second": (int, "Qwen2.5-VL: temporal M-RoPE positions per second of video (HF's "
                                      "vision_config.tokens_per_second; the released checkpoints' 2)"),
    "image_token_id": (int, "the image placeholder token id (HF's image_token_id)"),
    "video_token_id": (int, "the video placeholder token id (HF's video_token_id)"),
    "vision_start_token_id": (int, "the token id before an image/video span (HF's vision_start_token_id)"),
    "vision_end_token_id": (int, "the token id after an image/video span (HF's vision_end_token_id)"),
}
WINDOW_ONLY = ("vision_window_size", "vision_full_attention_layers", "vision_tokens_per_second")


def add_packed_vision_args(p: argparse.ArgumentParser) -> None:
    t = p.add_argument_group("Qwen2-VL / Qwen2.5-VL vision tower (default: the preset's; LLaVA's --vision-num-layers, "
                             "--vision-hidden-size, --vision-ffn-hidden-size, --vision-num-attention-heads, "
                             "--patch-dim too)")
    for dest, (kind, what) in TOWER_FLAGS.items():
        t.add_argument("--" + dest.replace("_", "-"), type=kind, default=None, help=what)
    t.add_argument("--vision-full-attention-layers", type=int, nargs="*", default=None,
                   help="Qwen2.5-VL: the tower layers (from 0) that attend over whole images, the others in windows "
                        "(HF's fullatt_block_indexes)")
    g = p.add_argument_group("Qwen2-VL / Qwen2.5-VL image resolution (HF's image processor min/max pixels)")
    g.add_argument("--min-pixels", type=int, default=None,
                   help="smallest image area in pixels: smaller images are scaled up to it (default 3136, 56x56)")
    g.add_argument("--max-pixels", type=int, default=None,
                   help="largest image area in pixels: larger images are scaled down to it (default 1003520, "
                        "1280 image tokens); e.g. 3136 trains every image at 56x56 or less")
    g.add_argument("--balance-micro-batches", action="store_true",
                   help="mtmegatron's (not Megatron-LM's): deal each global batch's conversations over the DP ranks "
                        "and micro-batches by load (text tokens + vision patches) instead of contiguous slices; the "
                        "same samples per global batch (data/vision/micro_batch_balance.py)")
    g.add_argument("--vision-packing", choices=("thd", "padded"), default=None,
                   help="mtmegatron's: pack the conversations into bins of --seq-length tokens as --sft does (a bin is "
                        "one sample of --global/--micro-batch-size); thd: a micro-batch is one THD row (attention "
                        "per conversation, 3-D positions kept); padded: the same bins, one padded row per "
                        "conversation (the reference layout). Default: one conversation per sample, padded "
                        "(tasks/qwen_vl/thd.py)")


def check_packed_vision_args(args: argparse.Namespace, error: type[Exception]) -> None:
    model = _packed_family(args)
    pixels = {"--min-pixels": args.min_pixels, "--max-pixels": args.max_pixels}
    if model is None:
        named = [flag for flag, value in pixels.items() if value is not None]
        named += [_flag(dest) for dest in (*TOWER_FLAGS, "vision_full_attention_layers")
                  if getattr(args, dest) is not None]
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
    if args.vision_num_layers is None or args.vision_spatial_merge_size is None:
        raise error(f"--model {model.name}: the vision tower comes from a preset (--model-size)")
    _check_tower(args, model, error)
    factor = args.patch_dim * args.vision_spatial_merge_size
    for flag, value in pixels.items():
        if value is not None and value < factor * factor:
            raise error(f"{flag} {value}: at least one {factor}x{factor} merge window ({factor * factor} pixels)")
    if None not in pixels.values() and args.min_pixels > args.max_pixels:
        raise error(f"--min-pixels {args.min_pixels} is more than --max-pixels {args.max_pixels}")
    tp = args.tensor_model_parallel_size
    if args.vision_num_attention_heads % tp:
        raise error(f"the vision tower's {args.vision_num_attention_heads} heads must be divisible by TP {tp} "
                    f"(--vision-num-attention-heads)")
    not_yet = {"--fp8-format": args.fp8_format, "--num-experts": args.num_experts,
               "--multi-latent-attention": args.multi_latent_attention}
    named = [flag for flag, on in not_yet.items() if on]
    if named:
        raise error(f"{', '.join(named)} with --model {model.name}: not supported yet (dense language models only)")
    cp = args.context_parallel_size  # --seq-length a multiple of 2 x CP: checked for every model
    if cp > 1 and args.sft:
        raise error(f"--context-parallel-size {cp} with --model {model.name} --sft: text SFT of these models is "
                    f"not supported under CP yet (train on image conversations, or drop CP)")


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def _check_tower(args: argparse.Namespace, model, error: type[Exception]) -> None:
    """The tower's shape (flags or preset): sizes positive, heads dividing the width into a head dim that is a
    multiple of 4; windows (and video time positions) only for a family whose presets have them, and there always."""
    for dest in ("vision_num_layers", "vision_hidden_size", "vision_ffn_hidden_size", "vision_num_attention_heads",
                 "patch_dim", "vision_temporal_patch_size", "vision_spatial_merge_size"):
        if getattr(args, dest) is None or getattr(args, dest) < 1:
            raise error(f"{_flag(dest)} must be >= 1, not {getattr(args, dest)} (the vision tower of --model "
                        f"{model.name})")
    width, heads = args.vision_hidden_size, args.vision_num_attention_heads
    if width % heads or (width // heads) % 4:
        raise error(f"--vision-hidden-size {width} / --vision-num-attention-heads {heads}: the vision head dim must "
                    f"be a whole multiple of 4 (its 2-D rotary angles take a quarter of it for rows, a quarter for "
                    f"columns)")
    windowed = any(preset.get("vision_window_size") for preset in model.presets.values())
    if not windowed:
        named = [_flag(dest) for dest in WINDOW_ONLY if getattr(args, dest) is not None]
        if named:
            raise error(f"{', '.join(named)}: --model {model.name}'s vision tower attends over whole images and "
                        f"steps video time by frame group (windows and tokens per second are Qwen2.5-VL's)")
        return
    factor = args.patch_dim * args.vision_spatial_merge_size
    if args.vision_window_size is None or args.vision_window_size < factor:
        raise error(f"--vision-window-size {args.vision_window_size}: at least one {factor}x{factor} merge block "
                    f"(--patch-dim x --vision-spatial-merge-size pixels)")
    negative = [i for i in args.vision_full_attention_layers or [] if i < 0]
    if negative:
        raise error(f"--vision-full-attention-layers {' '.join(map(str, args.vision_full_attention_layers))}: layer "
                    f"indexes count from 0")
    if args.vision_tokens_per_second is None or args.vision_tokens_per_second < 1:
        raise error(f"--vision-tokens-per-second must be >= 1, not {args.vision_tokens_per_second}")
