"""``--model llava`` flags (Megatron-LM's multimodal names where they exist) and their rules.

The language model takes the usual model flags (a Llama preset); the vision encoder, the projector, the image
geometry and the multimodal data flags are here. ``fill_llava_fields`` fills them from the preset (explicit flags
win) and refuses LLaVA-only flags on text models; ``check_llava_args`` raises one ``ConfigError`` per mistake
before any process group exists. For LLaVA, ``--seq-length`` becomes ``--decoder-seq-length``: the combined
image+text length the language model (and the pipeline's p2p shapes) sees.
May assume: the preset is applied (config/flag_sources.py) when ``fill_llava_fields`` runs.
"""

from __future__ import annotations

import argparse

from mtmegatron.models import families

VISION_MODEL_TYPES = ("clip", "siglip")
REFUSED_VISION_TYPES = ("internvit", "internvit300M", "radio", "radio-g", "cradio-g")

# LLaVA fields a preset may fill, with the value used when neither flag nor preset sets them.
LLAVA_FIELDS = {
    "vision_model_type": "clip", "img_h": 336, "img_w": 336, "patch_dim": 14, "vision_num_layers": None,
    "vision_hidden_size": None, "vision_ffn_hidden_size": None, "vision_num_attention_heads": None,
    "vision_norm_epsilon": 1e-5, "disable_vision_class_token": False, "decoder_seq_length": None,
    "max_num_tiles": 1, "prompt_format": None,  # None: the family's chat template
}
# flags that only mean something with --model llava (store_true ones default False, the rest None)
_LLAVA_ONLY_BOOLS = ("freeze_LM", "freeze_ViT", "freeze_projection", "use_tiling", "use_thumbnail", "pixel_shuffle",
                     "skip_bad_samples")


def add_llava_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("LLaVA (--model llava; see docs/llava.md)")
    g.add_argument("--vision-model-type", choices=VISION_MODEL_TYPES + REFUSED_VISION_TYPES, default=None,
                   help="vision encoder: clip (class token) or siglip (none)")
    for name, what in (
            ("img-h", "image (tile) height in pixels"), ("img-w", "image (tile) width in pixels"),
            ("patch-dim", "ViT patch size in pixels"),
            ("vision-num-layers", "vision encoder layers (those whose output LLaVA reads)"),
            ("vision-hidden-size", "vision encoder width"), ("vision-ffn-hidden-size", "vision encoder MLP width"),
            ("vision-num-attention-heads", "vision encoder attention heads"),
            ("decoder-seq-length", "combined image+text positions the language model sees (sets --seq-length)"),
            ("max-num-tiles", "with --use-tiling: most tiles per image"),
            ("decoder-first-pipeline-num-layers", "language layers on the first pipeline stage (which also "
                                                  "holds the vision encoder); the rest split evenly")):
        g.add_argument(f"--{name}", type=int, default=None, help=what)
    g.add_argument("--vision-norm-epsilon", type=float, default=None, help="vision encoder LayerNorm epsilon")
    g.add_argument("--disable-vision-class-token", action=argparse.BooleanOptionalAction, default=None,
                   help="drop the vision class token from the image embeddings (LLaVA-1.5's 'default' features); "
                        "--no-disable-vision-class-token keeps it whatever the preset says")
    g.add_argument("--freeze-LM", action="store_true", help="freeze the language model (LLaVA stage 1)")
    g.add_argument("--freeze-ViT", action="store_true", help="freeze the vision encoder")
    g.add_argument("--freeze-projection", action="store_true", help="freeze the vision projector")
    g.add_argument("--use-tiling", action="store_true", help="split images into up to --max-num-tiles tiles")
    g.add_argument("--use-thumbnail", action="store_true", help="add a thumbnail tile to tiled images")
    g.add_argument("--pixel-shuffle", action="store_true", help="4x fewer image embeddings (2x2 pixel shuffle)")
    g.add_argument("--image-folder", default=None, help="folder the JSONL's image paths are relative to "
                   "(default: the JSONL's directory)")
    g.add_argument("--prompt-format", default=None, help="conversation template: llama3 (default), plain, vicuna_v1")
    g.add_argument("--skip-bad-samples", action="store_true",
                   help="skip (and count) samples with missing/corrupt images or image spans that cannot fit, "
                        "instead of stopping with an error naming the sample")


def fill_llava_fields(args: argparse.Namespace, given: dict, error: type[Exception]) -> None:
    """Complete the LLaVA fields (the preset already filled what it has; ``given``: dest -> the user's flag); on a
    text model, refuse any LLaVA-only flag the user gave."""
    family = families.of(args)
    if not family.is_multimodal:
        shared = (("freeze_LM", "freeze_ViT", "freeze_projection", "image_folder", "skip_bad_samples",
                   "vision_num_layers", "vision_hidden_size", "vision_ffn_hidden_size", "vision_num_attention_heads",
                   "patch_dim", "vision_norm_epsilon")
                  if family.vision_encoder else ())  # models/families/qwen2_vl/model.py (its tower), tasks/qwen_vl/data.py
        named = [given[f] for f in (*LLAVA_FIELDS, *_LLAVA_ONLY_BOOLS, "image_folder")
                 if f in given and f not in shared]
        if named:
            raise error(f"{', '.join(named)}: LLaVA flags, only valid with --model llava (this run is --model "
                        f"{args.model})")
        return
    for field, fallback in LLAVA_FIELDS.items():
        if getattr(args, field) is None:
            setattr(args, field, family.chat_template if field == "prompt_format" else fallback)
    for field in ("vision_num_layers", "vision_hidden_size", "vision_num_attention_heads"):
        if getattr(args, field) is None:
            raise error(f"--{field.replace('_', '-')} is required (no preset value)")
    if args.vision_ffn_hidden_size is None:
        args.vision_ffn_hidden_size = 4 * args.vision_hidden_size
    if args.decoder_seq_length is None:
        args.decoder_seq_length = args.seq_length
    # the language model sees the combined image+text sequence: everything downstream uses that length
    args.seq_length = args.decoder_seq_length


def image_embeddings_per_tile(args: argparse.Namespace) -> int:
    """What the encoder + projector produce for one tile (megatron-core's get_num_image_embeddings)."""
    from megatron.core.models.vision.clip_vit_model import get_num_image_embeddings

    return get_num_image_embeddings(args.img_h, args.img_w, args.patch_dim, args.vision_model_type,
                                    args.disable_vision_class_token, class_token_len(args), args.pixel_shuffle)


def class_token_len(args: argparse.Namespace) -> int:
    return 0 if args.vision_model_type == "siglip" else 1


def max_tiles_per_image(args: argparse.Namespace) -> int:
    if not args.use_tiling:
        return 1
    return args.max_num_tiles + (1 if args.use_thumbnail and args.max_num_tiles > 1 else 0)


def check_llava_args(args: argparse.Namespace, error: type[Exception]) -> None:
    """Layouts and shapes megatron-core 0.16's LLaVAModel cannot run here: one message each."""
    if not families.of(args).is_multimodal:
        return
    if args.vision_model_type in REFUSED_VISION_TYPES:
        raise error(f"--vision-model-type {args.vision_model_type} is not supported here (supported: "
                    f"{', '.join(VISION_MODEL_TYPES)}); its megatron-core encoder needs TransformerEngine")
    if args.vision_model_type == "siglip" and args.disable_vision_class_token:
        raise error("--disable-vision-class-token: siglip has no class token")
    if args.img_h % args.patch_dim or args.img_w % args.patch_dim:
        raise error(f"--patch-dim {args.patch_dim} must divide --img-h {args.img_h} and --img-w {args.img_w}")
    if args.pixel_shuffle and ((args.img_h // args.patch_dim) % 2 or (args.img_w // args.patch_dim) % 2
                               or (args.vision_model_type == "clip" and not args.disable_vision_class_token)):
        raise error("--pixel-shuffle needs an even patch grid and no class token (--disable-vision-class-token)")
    if args.context_parallel_size > 1:
        raise error("--context-parallel-size > 1 with --model llava: megatron-core 0.16's LLaVAModel shards the "
                    "combined sequence for CP only through TransformerEngine (>= 1.10) and megatron.training; "
                    "use TP+SP to split long multimodal sequences")
    if args.num_experts or args.multi_latent_attention or args.mtp_num_layers:
        raise error("--model llava takes a dense Llama-style language model (no --num-experts, MLA or MTP)")
    if args.fp8_format:
        raise error("--fp8-format with --model llava is not supported here yet (the vision path is unverified "
                    "in FP8)")
    tp = args.tensor_model_parallel_size
    if args.vision_num_attention_heads % tp or args.vision_hidden_size % args.vision_num_attention_heads:
        raise error(f"the vision encoder's {args.vision_num_attention_heads} heads must be divisible by TP {tp} and "
                    f"divide --vision-hidden-size {args.vision_hidden_size}")
    if args.use_thumbnail and not args.use_tiling:
        raise error("--use-thumbnail needs --use-tiling")
    if args.max_num_tiles < 1:
        raise error("--max-num-tiles must be >= 1")
    per_image = image_embeddings_per_tile(args) * max_tiles_per_image(args)
    if per_image >= args.decoder_seq_length:
        raise error(f"one image takes {per_image} embeddings ({max_tiles_per_image(args)} tile(s)), which does not "
                    f"fit --decoder-seq-length {args.decoder_seq_length} with any text")
    if args.sequence_parallel and args.decoder_seq_length % tp:
        raise error(f"--sequence-parallel needs --decoder-seq-length {args.decoder_seq_length} divisible by TP {tp}")
    _check_pipeline_split(args, error)


def _check_pipeline_split(args: argparse.Namespace, error: type[Exception]) -> None:
    first, pp = args.decoder_first_pipeline_num_layers, args.pipeline_model_parallel_size
    if first is None:
        return
    if pp < 2:
        raise error("--decoder-first-pipeline-num-layers needs --pipeline-model-parallel-size >= 2")
    if args.virtual_pipeline_model_parallel_size:
        raise error("--decoder-first-pipeline-num-layers with virtual pipeline stages is not supported here; "
                    "use one or the other")
    rest = args.num_layers - first
    if not 0 < first < args.num_layers or rest % (pp - 1):
        raise error(f"--decoder-first-pipeline-num-layers {first}: the other {rest} of {args.num_layers} layers "
                    f"must split evenly over the remaining {pp - 1} stages (and each stage needs a layer)")
