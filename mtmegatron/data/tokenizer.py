"""Tokenizers for preprocessing and training, all offline.

Two sources: an HF tokenizer saved in a local directory (its ``tokenizer.json``, as written by
``tokenizers`` or ``transformers``' ``save_pretrained``), or a byte-level BPE that we train on the corpus
itself and save beside the data. The wrapper gives megatron-core's datasets what they read from a tokenizer
(``vocab_size``, ``eod``, ``pad``, ``unique_identifiers``) plus ``tokenize``/``detokenize``.
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
    """An HF ``tokenizers.Tokenizer`` with the interface megatron-core's GPT datasets use."""

    def __init__(self, tokenizer: Tokenizer, source: str):
        self.tokenizer = tokenizer
        self.source = source
        self.vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
        self.eod = self._special(EOD, ("</s>", "<|end_of_text|>", "<eos>", "[SEP]"))
        pad = tokenizer.token_to_id(PAD)
        self.pad = pad if pad is not None else -1  # -1: megatron-core's "no pad token"
        with open(source, "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()[:16]
        # the dataset index cache is keyed on this: same file contents -> same cache, wherever it lives
        self.unique_identifiers = {"class": "HFTokenizer", "vocab_size": self.vocab_size, "sha256": digest}

    def _special(self, preferred: str, fallbacks: tuple[str, ...]) -> int:
        for token in (preferred, *fallbacks):
            token_id = self.tokenizer.token_to_id(token)
            if token_id is not None:
                return token_id
        raise TokenizerError(f"tokenizer {self.source} has no end-of-document token ({preferred} or "
                             f"{', '.join(fallbacks)})")

    def tokenize(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def detokenize(self, ids: Iterable[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=False)


def load_tokenizer(path: str) -> HFTokenizer:
    """``path``: a ``tokenizer.json`` file or a directory holding one."""
    file = os.path.join(path, "tokenizer.json") if os.path.isdir(path) else path
    if not os.path.isfile(file):
        raise TokenizerError(f"no tokenizer at {path} (expected a tokenizer.json file or a directory with one)")
    try:
        tokenizer = Tokenizer.from_file(file)
    except Exception as e:  # the tokenizers library raises its own Exception type for bad JSON
        raise TokenizerError(f"{file} is not a valid HF tokenizer file: {e}") from None
    return HFTokenizer(tokenizer, file)


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
