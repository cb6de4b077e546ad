"""``build_multimodal_datasets``: the one entry point the LLaVA training side calls.

Reads these fields of data/vision/section.py's ``LlavaData`` (flags of ``--model llava``):
- ``data_path``: JSONL file(s), or JSON array files as LLaVA ships them (list or str); None -> the embedded
  shapes dataset (``shapes.py``; its ``*_captions.jsonl`` with ``--prompt-format plain``), generated once into
  the cache with its own tokenizer (``SHAPES_SEED``, at most ``SHAPES_MAX_SIDE`` pixels a side);
- ``valid_data_path`` (None: none): held-out JSONL file(s); without it ``split`` ("train,valid,test" weights,
  default "969,30,1") carves a seeded random held-out subset out of ``data_path``;
- ``image_folder``: where the JSONL image paths point (default: the first JSONL's directory);
- ``prompt_format``: template name (``template.TEMPLATES``; default the LLaVA family's chat template);
- ``tokenizer_model``: a local HF tokenizer directory; without it a byte-level BPE of ``vocab_size`` is trained
  on the conversations' text (special tokens whole) and cached;
- ``vocab_size``: the tokenizer must not be larger;
- ``vision_model_type`` (normalization mean/std; default clip), ``img_h``, ``img_w``, ``use_tiling``,
  ``max_num_tiles``, ``use_thumbnail``;
- ``decoder_seq_length``: every sample spans exactly this many combined (image + text) positions;
- ``skip_bad_samples``: leave out and count bad samples instead of stopping at the first;
- ``seed``: the held-out subset when carved from ``data_path``.
``img_seq_len`` (image embeddings per tile, computed by the model side) is a parameter.
Every user mistake (bad sample, unknown template, tokenizer too large, missing file) is one ``ConfigError``.
May assume: the LLaVA flags are parsed and checked (models/families/llava/flags.py); may run on every rank at once.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys

import numpy as np
import torch

from mtmegatron.data.vision.llava_collate import Collator
from mtmegatron.data.vision.llava_conversations import ConversationDataset, LoaderConfig, pad_id
from mtmegatron.data.vision.images import ImageConfig
from mtmegatron.data.vision.records import BadSample
from mtmegatron.data.vision.template import MULTIMODAL_SPECIAL_TOKENS, TemplateError
from mtmegatron.data.tokenizer import TokenizerError, load_tokenizer, train_bpe
from mtmegatron.data.vision.section import LlavaData
from mtmegatron.models.families import llava
from mtmegatron.utils.errors import ConfigError

SHAPES_SEED = 1234  # the embedded dataset does not change with --seed: runs with different seeds compare
SHAPES_MAX_SIDE = 64  # rendered at most this large; the loader resizes to --img-h x --img-w


def _as_list(paths) -> list[str]:
    return [paths] if isinstance(paths, str) else list(paths or [])


def _or(value, default):
    """``value``, or ``default`` where the flag was not given (None)."""
    return default if value is None else value


def _text_of(paths: list[str]):
    for path in paths:
        with open(path, encoding="utf-8") as f:
            if f.read(4096).lstrip().startswith("["):
                f.seek(0)
                try:
                    records = json.load(f)
                except ValueError:
                    records = []  # reported by the validation pass
            else:
                f.seek(0)
                records = (_loads(line) for line in f)
            for record in records:
                try:
                    for turn in record["conversations"]:
                        yield turn["value"].replace("<image>", "")
                except (KeyError, TypeError):
                    continue  # bad records are reported by the validation pass
    yield from ("user", "assistant", "system", "\n\n")


def _loads(line: str):
    try:
        return json.loads(line)
    except ValueError:
        return None


def _bpe_for(paths: list[str], vocab_size: int, special_tokens: tuple[str, ...] = MULTIMODAL_SPECIAL_TOKENS):
    """A byte-level BPE trained on the conversations' text (``special_tokens`` whole), cached by the files."""
    from mtmegatron.data.embedded import cache_root

    key = json.dumps([(os.path.abspath(p), os.path.getsize(p), os.stat(p).st_mtime_ns) for p in paths]
                     + ([list(special_tokens)] if special_tokens != MULTIMODAL_SPECIAL_TOKENS else []))
    directory = os.path.join(cache_root(), "multimodal-bpe",
                             hashlib.sha256(key.encode()).hexdigest()[:16] + f"-bpe{vocab_size}")
    if os.path.isfile(os.path.join(directory, "tokenizer.json")):
        return load_tokenizer(directory)
    return train_bpe(_text_of(paths), vocab_size, directory, special_tokens)


def _held_out(dataset, split: str, seed: int):
    weights = [float(w) for w in split.replace(" ", "").split(",")]
    valid_fraction = weights[1] / sum(weights) if len(weights) > 1 and sum(weights) > 0 else 0.0
    num_valid = int(round(len(dataset) * valid_fraction))
    if num_valid == 0:
        return dataset, None
    order = np.random.default_rng(seed).permutation(len(dataset)).tolist()
    return (torch.utils.data.Subset(dataset, sorted(order[num_valid:])),
            torch.utils.data.Subset(dataset, sorted(order[:num_valid])))


def build_multimodal_datasets(flags: LlavaData, img_seq_len: int, tokenizer=None, progress: bool = True):
    """(train dataset, valid dataset or None, tokenizer, info); ``info["collate_fn"]`` makes batches
    (``llava_collate.py``), ``info["bad_samples"]`` counts skipped samples (also printed to stderr when ``progress``),
    ``info["summary"]`` is one line for logs."""
    template = _or(flags.prompt_format, llava.FAMILY.chat_template)
    data_paths = _as_list(flags.data_path)
    valid_paths = _as_list(flags.valid_data_path)
    image_folder = flags.image_folder
    try:
        if not data_paths:
            from mtmegatron.data.vision import shapes

            directory, tokenizer_dir = shapes.prepare(
                seed=SHAPES_SEED, height=min(flags.img_h, SHAPES_MAX_SIDE), width=min(flags.img_w, SHAPES_MAX_SIDE),
                vocab_size=flags.vocab_size)
            suffix = "_captions.jsonl" if template == "plain" else ".jsonl"
            data_paths = [os.path.join(directory, "train" + suffix)]
            valid_paths = [os.path.join(directory, "valid" + suffix)]
            image_folder = directory
            if tokenizer is None and not flags.tokenizer_model:
                tokenizer = load_tokenizer(tokenizer_dir)
        for path in data_paths + valid_paths:
            if not os.path.isfile(path):
                raise ConfigError(f"--data-path: no such JSONL file: {path}")
        if tokenizer is None:
            model = flags.tokenizer_model
            tokenizer = load_tokenizer(model) if model else _bpe_for(data_paths, flags.vocab_size)
        if tokenizer.vocab_size > flags.vocab_size:
            raise ConfigError(f"the tokenizer {tokenizer.source} has {tokenizer.vocab_size} tokens, more than the "
                              f"model's --vocab-size {flags.vocab_size}")
        image = ImageConfig.for_vision_model(
            _or(flags.vision_model_type, "clip"), flags.img_h, flags.img_w,
            use_tiling=bool(flags.use_tiling), max_num_tiles=_or(flags.max_num_tiles, 1),
            use_thumbnail=bool(flags.use_thumbnail))
        config = LoaderConfig(template, img_seq_len, flags.decoder_seq_length, image,
                              bool(flags.skip_bad_samples))
        train = ConversationDataset(data_paths, image_folder, tokenizer, config, progress)
        bad = list(train.bad_samples)
        if valid_paths:
            valid = ConversationDataset(valid_paths, image_folder, tokenizer, config, progress)
            bad += valid.bad_samples
        else:
            train, valid = _held_out(train, _or(flags.split, "969,30,1"), flags.seed)
    except (BadSample, TemplateError, TokenizerError, FileNotFoundError, ValueError) as e:
        if isinstance(e, ConfigError):
            raise
        raise ConfigError(str(e)) from None
    info = {
        "collate_fn": Collator(pad_id(tokenizer), img_seq_len, flags.img_h, flags.img_w),
        "train_samples": len(train),
        "valid_samples": len(valid) if valid is not None else 0,
        "bad_samples": len(bad),
        "bad_examples": [f"{p}:{line} (id {sid!r}): {reason}" for p, line, sid, reason in bad[:5]],
        "data_path": data_paths,
        "valid_data_path": valid_paths,
        "template": template,
        "img_seq_len": img_seq_len,
        "tokenizer": tokenizer.source,
    }
    skipped = f", skipped {len(bad)} bad sample(s)" if bad else ""
    info["summary"] = (f"multimodal data: {info['train_samples']} train / {info['valid_samples']} valid samples "
                       f"({template} template, {img_seq_len} image embeddings per tile){skipped}")
    if bad and progress:  # progress: this is the rank that talks
        print(f"--skip-bad-samples: skipped {len(bad)} bad sample(s); first: {info['bad_examples'][0]}",
              file=sys.stderr)
    return train, valid, tokenizer, info
