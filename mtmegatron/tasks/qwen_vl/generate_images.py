"""``mtmegatron generate --image FILE [--image FILE ...]``: prompts about images for a native-resolution
vision-language model (a family with ``vision_encoder == "packed"``, models/families/qwen2_vl/model.py).

Every prompt is asked about all the ``--image`` files, in the order given, as one user turn rendered with the
Qwen2-VL chat template exactly as the training data renders it (data/vision/qwen_vl_chat.py: the default system
turn, each image as ``<|vision_start|>`` + one ``<|image_pad|>`` per merged 2x2 patch window + ``<|vision_end|>``),
followed by the assistant's generation prompt ``<|im_start|>assistant\\n``. An ``<image>`` tag in a prompt places
the next image there; a prompt without tags has the images first, each on its own line, then its text (the
training records' rule, data/vision/qwen_vl_records.py; HF's ``[image, ..., text]`` message content renders
without the newlines: write ``<image><image>text`` for that). Images are resized and cut into patches as for
training (data/vision/dynamic_resolution.py: HF's Qwen2-VL image processor, its default area bounds unless
``--min-pixels`` / ``--max-pixels`` are given); the prompt's M-RoPE positions are HF's ``get_rope_index``
(data/vision/mrope_positions.py).
A text prompt for such a model (no ``--image``) keeps its tokens (plain or ``--chat``), with text positions, and
is decoded on the same path (tasks/qwen_vl/generate_engine.py).
Mistakes, each one line before any process group: an image file missing or unreadable (named), ``--image`` for a
model without a vision tower, a tokenizer without the template's special tokens or with other ids than the
model reads, a prompt whose ``<image>`` tags do not match the number of images; each raised as the caller's
``error`` (generate/command.py passes its ``GenerateError``).
May assume: ``model_args`` validated the flags (generate/model.py); called identically on every rank.
"""

from __future__ import annotations

import dataclasses
import os

import torch

from mtmegatron.models import families


def _load(path: str, error: type[Exception]):
    from mtmegatron.data.vision.dynamic_resolution import load_image

    if not os.path.isfile(path):
        raise error(f"--image {path}: no such file")
    try:
        return load_image(path)
    except Exception as e:  # PIL: OSError, ValueError, SyntaxError, DecompressionBombError...
        reason = (str(e).splitlines() or [type(e).__name__])[0]
        raise error(f"--image {path}: cannot read it as an image ({reason})") from None


def _check_tokenizer(tokenizer, margs, error: type[Exception]) -> dict[str, int]:
    from mtmegatron.data.vision.template import TemplateError
    from mtmegatron.data.vision.qwen_vl_chat import special_ids
    from mtmegatron.tasks.qwen_vl.data import TOKEN_FIELDS

    try:
        ids = special_ids(tokenizer.hf)
    except TemplateError as e:
        raise error(f"--tokenizer-model: {e}") from None
    for field, token in TOKEN_FIELDS.items():
        if ids[token] != getattr(margs, field):
            raise error(f"--tokenizer-model {tokenizer.path}: {token} is id {ids[token]} but the model "
                                f"reads id {getattr(margs, field)} ({field}): not this model's tokenizer")
    return ids


def _pixel_bounds(args, config, error: type[Exception]):
    """The image patch config with ``--min-pixels`` / ``--max-pixels`` where given (checked)."""
    given = {field: value for field, value in (("min_pixels", args.min_pixels), ("max_pixels", args.max_pixels))
             if value is not None}
    for field, value in given.items():
        if value < 1:
            raise error(f"--{field.replace('_', '-')} must be >= 1")
    config = dataclasses.replace(config, **given)
    if config.min_pixels > config.max_pixels:
        raise error(f"--min-pixels {config.min_pixels} is more than --max-pixels {config.max_pixels}")
    return config


def _user_turn(prompt: str, number: int, num_images: int, error: type[Exception]):
    """The prompt as the user turn of a training record with these images: the data's own tag rule (untagged
    images go first, each tag on its own line; tags, when used, must match the images)."""
    from mtmegatron.data.vision.template import Turn
    from mtmegatron.data.vision.qwen_vl_records import _placed_tags

    def bad(reason: str) -> Exception:
        return error(f"prompt {number}: {reason} (the --image files)")

    return _placed_tags([Turn("user", prompt)], num_images, 0, bad)


def image_prompts(args, prompts: list[str], tokenizer, margs, error: type[Exception] = ValueError):
    """(prompt token ids, VisionPrompt per prompt) for ``--image`` prompts (module docstring)."""
    from mtmegatron.data.vision.dynamic_resolution import image_patches
    from mtmegatron.data.vision.mrope_positions import rope_index, token_types
    from mtmegatron.data.vision.qwen_vl_chat import IM_START, IMAGE_PAD, VIDEO_PAD, render_text
    from mtmegatron.tasks.qwen_vl.generate_prompts import VisionPrompt
    from mtmegatron.tasks.qwen_vl.data import data_config

    ids = _check_tokenizer(tokenizer, margs, error)
    config = _pixel_bounds(args, data_config(margs).image, error)
    parts = []
    for path in args.image:
        try:
            parts.append(image_patches(_load(path, error), config))
        except ValueError as e:  # an aspect ratio over 200
            raise error(f"--image {path}: {e}") from None
    pixel_values = torch.cat([p for p, _ in parts])
    grids = torch.tensor([list(g) for _, g in parts], dtype=torch.long)
    counts = [config.num_tokens(g) for _, g in parts]
    prompt_tokens, visions = [], []
    for number, prompt in enumerate(prompts, 1):
        text, _ = render_text(_user_turn(prompt, number, len(parts), error), counts, [])
        tokens = tokenizer.tokenizer.encode(text + f"{IM_START}assistant\n", add_special_tokens=False).ids
        types = token_types(torch.tensor([tokens]), ids[IMAGE_PAD], ids[VIDEO_PAD])
        try:
            positions, _ = rope_index(types, grids, merge_size=config.merge_size)
        except ValueError as e:  # e.g. a literal <|image_pad|> in the prompt's text
            raise error(f"prompt {number}: {e}") from None
        except StopIteration:  # a literal <|video_pad|> (no video to go with it)
            raise error(f"prompt {number}: its text holds {VIDEO_PAD} but no video is given") from None
        prompt_tokens.append(tokens)
        visions.append(VisionPrompt(positions[:, 0], pixel_values, grids))
    return prompt_tokens, visions


def vision_prompts(args, prompts: list[str], prompt_tokens: list[list[int]], tokenizer, margs,
                   error: type[Exception] = ValueError):
    """(prompt token ids, VisionPrompt per prompt or None): None for a model without a vision tower (the text
    engine), image prompts for ``--image``, text positions for a text prompt to a vision-language model."""
    from mtmegatron.tasks.qwen_vl.generate_prompts import VisionPrompt

    packed = families.of(margs).vision_encoder == "packed"
    if args.image and not packed:
        raise error(f"--image: --load holds a --model {margs.model or 'gpt'} model, which has no vision "
                            "tower to read images (text only)")
    if not args.image and (args.min_pixels is not None or args.max_pixels is not None):
        raise error("--min-pixels / --max-pixels size images: give them with --image")
    if not packed:
        return prompt_tokens, None
    if args.image:
        return image_prompts(args, prompts, tokenizer, margs, error)
    return prompt_tokens, [VisionPrompt(torch.arange(len(t)).expand(3, -1)) for t in prompt_tokens]


def generate_for_vision_model(args, model, tokenizer, prompts, prompt_tokens, visions, sampling):
    """The KV-cache engine (tasks/qwen_vl/generate_engine.py), or with ``--no-kv-cache`` the full-recompute greedy
    reference (tasks/qwen_vl/generate_recompute.py)."""
    if args.no_kv_cache:
        from mtmegatron.tasks.qwen_vl.generate_recompute import generate_with_images_without_cache

        return generate_with_images_without_cache(model, tokenizer, prompts, prompt_tokens, visions,
                                                  args.max_new_tokens)
    from mtmegatron.tasks.qwen_vl.generate_engine import generate_with_images

    return generate_with_images(model, tokenizer, prompts, prompt_tokens, visions, sampling,
                                max_batch_size=args.inference_max_batch_size)
