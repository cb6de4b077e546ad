"""Training data of the native-resolution vision-language models (a family with ``vision_encoder == "packed"``:
models/families/qwen2_vl/model.py): ``--data-path conversations.jsonl [--image-folder DIR]`` (LLaVA's JSONL layout, extended to
several images and videos per record: data/vision/qwen_vl_records.py) -> the samples of
data/vision/qwen_vl_samples.py, read as LLaVA's are (``tasks/llava/data.py``'s ``Split`` and
``MicroBatches``: a seeded permutation per epoch, each DP rank its contiguous slice) and collated padded to
``--seq-length`` (the pipeline schedule's fixed activation shape), or with ``--vision-packing thd|padded`` packed
into bins as ``--sft`` packs (tasks/qwen_vl/thd.py; ``info["padded_collate_fn"]`` and
``info["samples_valid"]`` keep the padded conversations for the held-out answer scoring; ``info["padded_rows"]``
the padded layout's rows per micro-batch). Images are resized within ``--min-pixels`` ..
``--max-pixels`` (HF's image processor bounds; default its own).

``reads_vision_data``: a packed-vision family whose ``--data-path`` (or ``--train-data-path``) names JSONL/JSON
conversation files (not ``--mock-data``, not ``--sft``); other data (mock, Megatron indexed text) trains the language
model alone, as before.
``prepare`` builds the train and held-out datasets before any process group starts. The tokenizer:
``--tokenizer-model DIR`` (its special-token ids must be the run's ``image_token_id`` etc.: preset or flags), else
a byte-level BPE of at most ``--vocab-size`` tokens trained on the conversations with the chat template's special
tokens (cached); the model then reads its ids (the run's ``image_token_id`` etc. are set from it). Every user
mistake (bad record, missing image, tokenizer too large) is one ``ConfigError`` line naming file:line (exit 2).
Held out: ``--valid-data-path`` (with ``--train-data-path``), else ``--split``'s valid share of ``--data-path``
(seeded by ``--seed``).
Video time positions: ``--vision-tokens-per-second`` (Qwen2.5-VL; preset or the converted checkpoint's flags).
May assume: flags parsed and checked (the ``vision_*``, ``patch_dim`` and token-id fields present); args
still writable (called from ``pretrain.prepare`` before the run plan freezes them).
"""

from __future__ import annotations

import argparse
import dataclasses
from functools import partial

from mtmegatron.models import families
from mtmegatron.tasks.section import RunKind
from mtmegatron.utils.errors import ConfigError

CONVERSATION_SUFFIXES = (".jsonl", ".json")
TOKEN_FIELDS = {"image_token_id": "<|image_pad|>", "video_token_id": "<|video_pad|>",
                "vision_start_token_id": "<|vision_start|>", "vision_end_token_id": "<|vision_end|>"}


def _train_paths(kind: RunKind) -> list:
    """``--data-path``, else ``--train-data-path`` (then ``--valid-data-path`` is the held-out set)."""
    paths = kind.data_path or kind.train_data_path
    return paths if isinstance(paths, list) else [paths] if paths else []


def reads_vision_data(kind: RunKind) -> bool:
    """Whether this run trains on image/video conversations (module docstring)."""
    paths = _train_paths(kind)
    return (families.of(kind).task == "qwen_vl" and not kind.mock_data and not kind.sft and bool(paths)
            and all(str(p).endswith(CONVERSATION_SUFFIXES) for p in paths))


def check_balance(args: argparse.Namespace) -> None:
    """``--balance-micro-batches`` and ``--vision-packing`` need conversations to work on (one line otherwise)."""
    for flag, on in (("--balance-micro-batches balances", args.balance_micro_batches),
                     (f"--vision-packing {args.vision_packing} packs", args.vision_packing)):
        if on and not reads_vision_data(RunKind.of(args)):
            raise ConfigError(f"{flag} image/video conversations: give --data-path conversations.jsonl (not "
                              f"--mock-data, --sft or indexed text)")


def data_config(args: argparse.Namespace):
    from mtmegatron.data.vision.dynamic_resolution import IMAGE_PIXELS, VIDEO_PIXELS
    from mtmegatron.data.vision.qwen_vl_samples import VisionDataConfig

    patches = dict(patch_size=args.patch_dim, temporal_patch_size=args.vision_temporal_patch_size,
                   merge_size=args.vision_spatial_merge_size)
    image_area = {field: value for field, value in (("min_pixels", args.min_pixels), ("max_pixels", args.max_pixels))
                  if value is not None}  # --min-pixels / --max-pixels
    # Qwen2.5-VL places video frames by time (--vision-tokens-per-second: HF's vision_config.tokens_per_second,
    # the released configs' 2); Qwen2-VL steps one position per temporal patch (None)
    return VisionDataConfig(seq_length=args.seq_length,
                            image=dataclasses.replace(IMAGE_PIXELS, **patches, **image_area),
                            video=dataclasses.replace(VIDEO_PIXELS, **patches),
                            tokens_per_second=args.vision_tokens_per_second,
                            skip_bad_samples=args.skip_bad_samples)


def _tokenizer(args: argparse.Namespace, paths: list[str]):
    from mtmegatron.data.vision.build import _bpe_for
    from mtmegatron.data.vision.qwen_vl_chat import SPECIAL_TOKENS, special_ids
    from mtmegatron.data.tokenizer import load_tokenizer

    model = args.tokenizer_model
    tokenizer = load_tokenizer(model) if model else _bpe_for(paths, args.vocab_size, SPECIAL_TOKENS)
    if tokenizer.vocab_size > args.vocab_size:
        raise ConfigError(f"the tokenizer {tokenizer.source} has {tokenizer.vocab_size} tokens, more than the "
                          f"model's --vocab-size {args.vocab_size}")
    ids = special_ids(tokenizer)
    expected = {"image_token_id": args.image_token_id, "video_token_id": args.video_token_id,
                "vision_start_token_id": args.vision_start_token_id, "vision_end_token_id": args.vision_end_token_id}
    for field, token in TOKEN_FIELDS.items():
        if model and ids[token] != expected[field]:
            raise ConfigError(f"--tokenizer-model {model}: {token} is id {ids[token]} but --model "
                              f"{args.model} --model-size {args.model_size} reads id {expected[field]} "
                              f"(--{field.replace('_', '-')})")
        setattr(args, field, ids[token])  # a tokenizer trained here: the model reads its ids
    return tokenizer


def prepare(args: argparse.Namespace, progress: bool = True):
    """``multimodal_data.MultimodalData`` of the run (train, held-out or None, tokenizer, info with
    ``collate_fn`` and a one-line ``summary``)."""
    from mtmegatron.data.vision.build import _held_out
    from mtmegatron.data.vision.llava_conversations import pad_id
    from mtmegatron.data.vision.template import TemplateError
    from mtmegatron.data.vision.qwen_vl_samples import collate_padded, load_vision_conversations
    from mtmegatron.data.tokenizer import TokenizerError
    from mtmegatron.tasks.llava.data import MultimodalData

    paths = _train_paths(RunKind.of(args))
    valid_paths = args.valid_data_path or []
    valid_paths = [valid_paths] if isinstance(valid_paths, str) else list(valid_paths)
    image_folder = args.image_folder
    config = data_config(args)
    try:
        tokenizer = _tokenizer(args, paths)
        train = load_vision_conversations(paths, image_folder, tokenizer, config)
        if valid_paths:
            valid = load_vision_conversations(valid_paths, image_folder, tokenizer, config)
        else:
            train, valid = _held_out(train, args.split or "969,30,1", args.seed)
    except (TemplateError, TokenizerError, FileNotFoundError) as e:
        raise ConfigError(str(e)) from None
    bad = len(_base(train).bad_samples) + (len(_base(valid).bad_samples) if valid is not None else 0)
    padded = partial(collate_padded, pad_id=pad_id(tokenizer), length=args.seq_length)
    info = {"collate_fn": padded, "padded_collate_fn": padded,
            "train_samples": len(train), "valid_samples": len(valid) if valid is not None else 0,
            "bad_samples": bad}
    layout = f"padded to {args.seq_length}"
    if args.vision_packing:  # SFT's packing plan: bins of conversations (tasks/qwen_vl/thd.py)
        from mtmegatron.tasks.qwen_vl.section import Packing
        from mtmegatron.tasks.qwen_vl.thd import binned

        info["samples_valid"] = valid  # the held-out answer scoring reads conversations, padded
        train, valid, info["collate_fn"], layout, info["padded_rows"] = binned(train, valid, Packing.of(args),
                                                                               pad_id(tokenizer))
    skipped = f", skipped {bad} bad sample(s)" if bad else ""
    info["summary"] = (f"vision conversations: {info['train_samples']} train / {info['valid_samples']} valid "
                       f"samples (native resolution, {config.image.min_pixels}..{config.image.max_pixels} pixels "
                       f"per image, {layout}){skipped}")
    return MultimodalData(train, valid, tokenizer, info)


def _base(dataset):
    return dataset.dataset if hasattr(dataset, "indices") else dataset
