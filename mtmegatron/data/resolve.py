"""Turns the data flags of a pretrain run into checked datasets before any process group starts.

No ``--data-path``, no ``--train/valid/test-data-path`` and no ``--mock-data``: the embedded corpus, preprocessed
on first use (``embedded.py``), with its own tokenizer. Otherwise every prefix of the blend(s) (read as
megatron-core reads a blend: ``P1 P2 ...`` or ``W1 P1 W2 P2 ...``) must be a whole ``.bin``/``.idx`` pair, no
split that ``--split`` gives a share may be empty (data/splits.empty_splits), and the tokenizer flags
must name the tokenizer it was made with. With Megatron-LM's ``--tokenizer-type`` (also
with ``--mock-data``, as Megatron-LM builds it there too) the model's vocabulary follows the tokenizer, as in
Megatron-LM: ``args.vocab_size`` becomes the tokenizer's and ``padded_vocab_size`` is recomputed
(models/vocab.py). Without it, a local HF tokenizer (``--tokenizer-model DIR``) must fit ``--vocab-size``.
Every problem is one ``ConfigError``.
May assume: flags parsed and validated (config/arguments.py); runs on every rank.
"""

from __future__ import annotations

import argparse
import os

from mtmegatron.data.indexed import DataError, check_indexed_dataset
from mtmegatron.data.section import Splits, Tokenizer
from mtmegatron.data.splits import empty_splits
from mtmegatron.data.tokenizer import TokenizerError, load_tokenizer
from mtmegatron.utils.errors import ConfigError


def blend_prefixes(data_path: list[str]) -> list[str]:
    """The prefixes of a blend (``P1 P2 ...`` or ``W1 P1 W2 P2 ...``), read as megatron-core reads it."""
    from megatron.core.datasets.utils import get_blend_from_list

    return get_blend_from_list(data_path)[0]


def valid_samples(args: argparse.Namespace) -> int | None:
    """Samples pretrain asks of the validation split (None: no validation)."""
    return args.eval_iters * args.global_batch_size or None


def _typed_tokenizer(args: argparse.Namespace):
    """The ``--tokenizer-type`` tokenizer; the model's vocabulary follows it (Megatron-LM's rule)."""
    from mtmegatron.data.tokenizer_build import build_tokenizer
    from mtmegatron.models.vocab import check_vocab_padding

    try:
        tokenizer = build_tokenizer(Tokenizer.of(args))
    except TokenizerError as e:
        raise ConfigError(str(e)) from None
    args.vocab_size = tokenizer.model_vocab_size
    check_vocab_padding(args, ConfigError)
    if args.tokenizer_type == "NullTokenizer" and not args.sample_prompt:
        args.num_samples = 0  # the built-in sample prompts are text; NullTokenizer reads space-separated ids
    return tokenizer


def resolve_data(args: argparse.Namespace, progress: bool = True):
    """Fill args.data_path / tokenizer_model / data_cache_path (and, with --tokenizer-type, vocab_size and
    padded_vocab_size); returns the tokenizer (None for mock data without --tokenizer-type)."""
    per_split = [p for p in (args.train_data_path, args.valid_data_path, args.test_data_path) if p]
    if args.tokenizer_type:
        if not args.mock_data and not args.data_path and not per_split:
            raise ConfigError(f"--tokenizer-type {args.tokenizer_type} needs --data-path (data preprocessed with "
                              f"that tokenizer: `mtmegatron preprocess`) or --mock-data")
        tokenizer = _typed_tokenizer(args)
        if args.mock_data:
            return tokenizer
    elif args.mock_data:
        return None
    if not args.data_path and not per_split:
        from mtmegatron.data import embedded

        try:
            prefix, tokenizer_dir = embedded.prepare(args.vocab_size, progress=progress)
        except TokenizerError as e:
            raise ConfigError(f"the embedded corpus needs a larger --vocab-size: {e}") from None
        args.data_path = [prefix]
        args.tokenizer_model = args.tokenizer_model or tokenizer_dir
    elif not args.tokenizer_model and not args.tokenizer_type:
        flag = "--data-path" if args.data_path else "--train-data-path"
        raise ConfigError(f"{flag} needs --tokenizer-model DIR or --tokenizer-type (the tokenizer the data was "
                          "preprocessed with)")
    prefixes = [prefix for blend in ([args.data_path] if args.data_path else per_split)
                for prefix in blend_prefixes(blend)]
    try:
        for prefix in prefixes:
            counts = check_indexed_dataset(prefix)
            empty = empty_splits(Splits.of(args), counts["sequences"], valid_samples(args)) if args.data_path else []
            if empty:
                raise ConfigError(f"--split {args.split} gives the {'/'.join(empty)} split of {prefix} no sequence "
                                  f"(it has {counts['sequences']}); megatron-core cannot draw samples from it: "
                                  f"give that split a larger share or 0")
        if not args.tokenizer_type:
            tokenizer = load_tokenizer(args.tokenizer_model)
    except (DataError, TokenizerError) as e:
        raise ConfigError(str(e)) from None
    if tokenizer.vocab_size > args.vocab_size:
        raise ConfigError(f"the tokenizer {tokenizer.source} has {tokenizer.vocab_size} tokens, more than the "
                          f"model's --vocab-size {args.vocab_size}")
    if args.data_cache_path is None:
        args.data_cache_path = os.path.join(os.path.dirname(os.path.abspath(prefixes[0])), "cache")
    return tokenizer
