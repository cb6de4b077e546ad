"""Turns the data flags of a pretrain run into checked datasets before any process group starts.

No ``--data-path`` and no ``--mock-data``: the embedded corpus, preprocessed on first use (``embedded.py``),
with its own tokenizer. ``--data-path``: every prefix of the blend must be a whole ``.bin``/``.idx`` pair and
``--tokenizer-model`` must name the tokenizer it was made with, no larger than the model's vocabulary.
Every problem is one ``ConfigError``.
May assume: flags parsed and validated (training/arguments.py); runs on every rank.
"""

from __future__ import annotations

import argparse
import os

from mtmegatron.data.indexed import DataError, check_indexed_dataset
from mtmegatron.data.tokenizer import HFTokenizer, TokenizerError, load_tokenizer
from mtmegatron.training.arguments import ConfigError


def blend_prefixes(data_path: list[str]) -> list[str]:
    """The prefixes of ``--data-path`` (``P1 P2 ...`` or ``W1 P1 W2 P2 ...``)."""
    return data_path if len(data_path) % 2 else data_path[1::2]


def resolve_data(args: argparse.Namespace, progress: bool = True) -> HFTokenizer | None:
    """Fill args.data_path / tokenizer_model / data_cache_path; returns the tokenizer (None for mock data)."""
    if args.mock_data:
        return None
    if not args.data_path:
        from mtmegatron.data import embedded

        try:
            prefix, tokenizer_dir = embedded.prepare(args.vocab_size, progress=progress)
        except TokenizerError as e:
            raise ConfigError(f"the embedded corpus needs a larger --vocab-size: {e}") from None
        args.data_path = [prefix]
        args.tokenizer_model = args.tokenizer_model or tokenizer_dir
    elif not args.tokenizer_model:
        raise ConfigError("--data-path needs --tokenizer-model DIR (the tokenizer the data was preprocessed with)")
    if len(args.data_path) % 2 == 0:
        for weight in args.data_path[0::2]:
            try:
                float(weight)
            except ValueError:
                raise ConfigError(f"--data-path: {weight!r} is not a weight (use 'P1 P2 ...' or "
                                  f"'W1 P1 W2 P2 ...')") from None
    try:
        for prefix in blend_prefixes(args.data_path):
            check_indexed_dataset(prefix)
        tokenizer = load_tokenizer(args.tokenizer_model)
    except (DataError, TokenizerError) as e:
        raise ConfigError(str(e)) from None
    if tokenizer.vocab_size > args.vocab_size:
        raise ConfigError(f"the tokenizer {tokenizer.source} has {tokenizer.vocab_size} tokens, more than the "
                          f"model's --vocab-size {args.vocab_size}")
    if args.data_cache_path is None:
        first = blend_prefixes(args.data_path)[0]
        args.data_cache_path = os.path.join(os.path.dirname(os.path.abspath(first)), "cache")
    return tokenizer
