"""Tokenizers for preprocessing and training, all offline.

Two sources when no ``--tokenizer-type`` is given: an HF tokenizer saved in a local directory (its
``tokenizer.json``, as written by ``tokenizers`` or ``transformers``' ``save_pretrained``; end-of-document is
its tokenizer_config.json's ``eos_token``), or a byte-level BPE that we train on the corpus itself and save
beside the data. Megatron-LM's ``--tokenizer-type`` kinds are built by data/tokenizer_build.py. The wrapper
gives megatron-core's datasets what they read from a tokenizer (``vocab_size``, ``eod``, ``pad``,
``unique_identifiers``) plus ``tokenize``/``detokenize``.
May assume: HF ``tokenizers`` is installed; never downloads anything.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Iterable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

EOD = "<|endoftext|>"
PAD = "<|pad|>"
# byte-level BPE needs its 256 byte symbols plus the two special tokens before any merge
MIN_BPE_VOCAB = 256 + 2


class TokenizerError(ValueError):
    """A tokenizer that cannot be loaded or used; the message says why."""


class HFTokenizer:
    """An HF ``tokenizers.Tokenizer`` with the interface megatron-core's GPT datasets use.

    ``eod``: the end-of-document id when the caller knows it (GPT-2's ``<|endoftext|>``); else it is read from
    the tokenizer's own config (``configured_eos``). ``source``: the file (or files) it was loaded from; the
    dataset index cache is keyed on their contents, so the same files give the same cache wherever they live."""

    def __init__(self, tokenizer: Tokenizer, source: str | list[str], eod: int | None = None,
                 kind: str = "HFTokenizer"):
        self.tokenizer = tokenizer
        files = [source] if isinstance(source, str) else list(source)
        self.source = files[0]
        self.vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
        self.model_vocab_size = self.vocab_size  # the vocabulary a model for this tokenizer is built with
        self.eod = eod if eod is not None else self._id(configured_eos(self.source), self.source)
        pad = tokenizer.token_to_id(PAD)
        self.pad = pad if pad is not None else -1  # -1: megatron-core's "no pad token"
        digest = hashlib.sha256()
        for file in files:
            with open(file, "rb") as f:
                digest.update(f.read())
        self.unique_identifiers = {"class": kind, "vocab_size": self.vocab_size, "sha256": digest.hexdigest()[:16]}

    def _id(self, token: str, source: str) -> int:
        token_id = self.tokenizer.token_to_id(token)
        if token_id is None:
            raise TokenizerError(f"tokenizer {source}: its end-of-document token {token!r} is not in its vocabulary")
        return token_id

    def tokenize(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def detokenize(self, ids: Iterable[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=False)


def configured_eos(tokenizer_file: str) -> str:
    """The end-of-document token of an HF tokenizer: ``eos_token`` of the tokenizer_config.json beside
    ``tokenizer_file`` (a string, or an ``AddedToken`` dict as DeepSeek-V3 writes it). A bare tokenizer.json
    (no config, as the ``tokenizers`` library saves one) ends documents with ``<|endoftext|>``, this package's
    and GPT-2's token; any other tokenizer must name its eos_token in a tokenizer_config.json."""
    config_file = os.path.join(os.path.dirname(os.path.abspath(tokenizer_file)), "tokenizer_config.json")
    if not os.path.isfile(config_file):
        return EOD
    try:
        with open(config_file, encoding="utf-8") as f:
            eos = json.load(f).get("eos_token")
    except (json.JSONDecodeError, AttributeError) as e:
        raise TokenizerError(f"{config_file} is not a JSON object: {e}") from None
    if isinstance(eos, dict):
        eos = eos.get("content")
    if not isinstance(eos, str) or not eos:
        raise TokenizerError(f"{config_file} names no eos_token (the end-of-document token); add one, e.g. "
                             f'"eos_token": "{EOD}"')
    return eos


def load_tokenizer(path: str, require_eod: bool = True) -> HFTokenizer:
    """``path``: a ``tokenizer.json`` file or a directory holding one. ``require_eod`` False: a tokenizer that
    names no end-of-document token loads with ``eod`` None (preprocess without --append-eod)."""
    file = os.path.join(path, "tokenizer.json") if os.path.isdir(path) else path
    if not os.path.isfile(file):
        raise TokenizerError(f"no tokenizer at {path} (expected a tokenizer.json file or a directory with one)")
    try:
        tokenizer = Tokenizer.from_file(file)
    except Exception as e:  # the tokenizers library raises its own Exception type for bad JSON
        raise TokenizerError(f"{file} is not a valid HF tokenizer file: {e}") from None
    try:
        return HFTokenizer(tokenizer, file)
    except TokenizerError:
        if require_eod:
            raise
        hf = HFTokenizer(tokenizer, file, eod=-1)
        hf.eod = None
        return hf


def train_bpe(texts: Iterable[str], vocab_size: int, out_dir: str,
              extra_special_tokens: tuple[str, ...] = ()) -> HFTokenizer:
    """Train a byte-level BPE of at most ``vocab_size`` tokens on ``texts``; saved as out_dir/tokenizer.json.
    ``extra_special_tokens`` (e.g. a chat template's ``<|eot_id|>``) each become one token, never split."""
    special_tokens = [EOD, PAD, *extra_special_tokens]
    if vocab_size < 256 + len(special_tokens):
        raise TokenizerError(f"a byte-level BPE needs a vocabulary of at least {256 + len(special_tokens)} tokens "
                             f"(asked for {vocab_size})")
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=special_tokens, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(texts, trainer=trainer)
    os.makedirs(out_dir, exist_ok=True)
    file = os.path.join(out_dir, "tokenizer.json")
    tmp = f"{file}.tmp{os.getpid()}"
    tokenizer.save(tmp)
    os.replace(tmp, file)
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:  # what transformers needs to load it
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": EOD, "pad_token": PAD}, f)
    return HFTokenizer(tokenizer, file)
