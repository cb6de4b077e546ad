"""Builds the tokenizer named by Megatron-LM's ``--tokenizer-type`` flags (config/tokenizer_flags.py).

megatron-core's own tokenizer library does the work where it serves offline: ``build_tokenizer`` of
``megatron.core.tokenizers`` for HuggingFaceTokenizer (transformers' AutoTokenizer on a local directory or hub
name), SentencePieceTokenizer / GPTSentencePieceTokenizer / Llama2Tokenizer (sentencepiece), TikTokenizer
(tiktoken) and NullTokenizer. GPT2BPETokenizer is the exception: megatron-core's ``megatron`` library loads
it through the hub name ``gpt2`` (a download), so here the given vocab.json + merges.txt become an HF
``tokenizers`` byte-level BPE with GPT-2's pre-tokenizer, which encodes exactly as GPT-2's BPE does.

End-of-document is the tokenizer's own: ``eos_token`` of a HuggingFace tokenizer's tokenizer_config.json, the
SentencePiece model's EOS id, GPT-2's ``<|endoftext|>``, TikTokenizer's ``</s>``, NullTokenizer's id N.
A tokenizer that defines none is refused. ``model_vocab_size`` is the vocabulary Megatron-LM builds the model
with for this type (its tokenizer's ``vocab_size``; for SentencePieceTokenizer Megatron-LM's training
tokenizer also counts the special pieces it adds), padded later by models/vocab.py.
Every function takes data/section.py's ``Tokenizer`` (the tokenizer flags), built by its caller.
May assume: the flags passed check_tokenizer_args; nothing here starts a process group.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import warnings

from mtmegatron.data.section import Tokenizer
from mtmegatron.data.tokenizer import TokenizerError

GPT2_EOD = "<|endoftext|>"  # GPT-2's end-of-text token, Megatron-LM's GPT2BPETokenizer eod


class CoreTokenizer:
    """A megatron-core text tokenizer with the interface this package and megatron-core's datasets read
    (``vocab_size``, ``eod``, ``pad``, ``unique_identifiers``, ``tokenize``, ``detokenize``) plus ``source``."""

    def __init__(self, inner, kind: str, source: str, model_vocab_size: int | None = None, require_eod: bool = True):
        self.inner = inner
        self.kind = kind
        self.source = source
        self.vocab_size = int(inner.vocab_size)
        try:
            self.eod = inner.eod
        except Exception:  # megatron-core's tokenizer classes raise their own types for a token they lack
            self.eod = None
        if self.eod is not None and not 0 <= int(self.eod) < self.vocab_size:
            self.eod = None
        if self.eod is None and require_eod:  # preprocess without --append-eod does not (nor Megatron-LM's)
            raise TokenizerError(f"--tokenizer-type {kind} {source} defines no end-of-document token"
                                 + (" (no eos_token in its tokenizer_config.json)" if kind == "HuggingFaceTokenizer"
                                    else " (the model has no EOS piece)" if "SentencePiece" in kind or
                                    kind == "Llama2Tokenizer" else ""))
        self.eod = None if self.eod is None else int(self.eod)
        self.model_vocab_size = model_vocab_size or self.vocab_size
        self.unique_identifiers = inner.unique_identifiers

    @property
    def pad(self) -> int:
        return self.inner.pad  # may raise: megatron-core's datasets then use their own pad id

    def tokenize(self, text: str) -> list[int]:
        return list(self.inner.tokenize(text))

    def detokenize(self, ids) -> str:
        return self.inner.detokenize(list(ids))


def _core_args(flags: Tokenizer, **changes) -> argparse.Namespace:
    """The namespace megatron-core's build_tokenizer reads (every field it touches present)."""
    return argparse.Namespace(**{**dataclasses.asdict(flags), "tokenizer_metadata": None, **changes})


def _first_line(e: BaseException) -> str:
    text = str(e).strip() or type(e).__name__
    return text.splitlines()[0]


def sentencepiece_model_vocab_size(model_file: str) -> int:
    """Megatron-LM's SentencePieceTokenizer vocabulary: the model's pieces plus those of <CLS> <SEP> <EOD> <MASK>
    and the pad/BOS/EOS pieces (``<PAD>``/``<BOS>``/``<EOS>`` when the model has none) it does not already have."""
    import sentencepiece

    sp = sentencepiece.SentencePieceProcessor(model_file=model_file)
    pieces = {sp.id_to_piece(i) for i in range(sp.get_piece_size())}
    added = {"<CLS>", "<SEP>", "<EOD>", "<MASK>"}
    for token_id, fallback in ((sp.pad_id(), "<PAD>"), (sp.bos_id(), "<BOS>"), (sp.eos_id(), "<EOS>")):
        added.add(sp.id_to_piece(token_id) if 0 <= token_id < sp.get_piece_size() else fallback)
    return sp.get_piece_size() + len(added - pieces)


def _gpt2_bpe(flags: Tokenizer):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    from mtmegatron.data.tokenizer import HFTokenizer

    try:
        with open(flags.vocab_file, encoding="utf-8") as f:
            vocab = json.load(f)
        bpe = models.BPE.from_file(flags.vocab_file, flags.merge_file)
    except Exception as e:  # json or the tokenizers library's own Exception type
        raise TokenizerError(f"--vocab-file {flags.vocab_file} / --merge-file {flags.merge_file} are not a GPT-2 "
                             f"BPE vocab.json + merges.txt: {_first_line(e)}") from None
    if GPT2_EOD not in vocab:
        raise TokenizerError(f"--vocab-file {flags.vocab_file} has no {GPT2_EOD} (GPT-2's end-of-document token)")
    tokenizer = Tokenizer(bpe)
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    return HFTokenizer(tokenizer, [flags.vocab_file, flags.merge_file], eod=vocab[GPT2_EOD],
                       kind="GPT2BPETokenizer")


def build_tokenizer(flags: Tokenizer, require_eod: bool = True):
    """The tokenizer of ``flags.tokenizer_type`` (flags already checked); TokenizerError with one line when the
    files cannot be loaded as that type. ``require_eod``: it must have an end-of-document token (preprocess
    without ``--append-eod`` needs none)."""
    kind = flags.tokenizer_type
    if kind == "GPT2BPETokenizer":
        return _gpt2_bpe(flags)
    from megatron.core.tokenizers.text.utils.build_tokenizer import build_tokenizer as core_build_tokenizer

    changes, source, model_vocab_size = {}, flags.tokenizer_model, None
    if kind == "HuggingFaceTokenizer":
        path = os.path.expanduser(flags.tokenizer_model)
        if os.path.isfile(path):  # a tokenizer.json: transformers loads the directory holding it
            path = os.path.dirname(os.path.abspath(path))
        changes["tokenizer_model"] = source = path
    elif kind == "NullTokenizer":
        source = f"NullTokenizer(--vocab-size {flags.vocab_size})"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            previous = logging.root.manager.disable
            logging.disable(max(previous, logging.WARNING))  # transformers' notes on tokenizer classes, per rank
            try:
                inner = core_build_tokenizer(_core_args(flags, **changes))
            finally:
                logging.disable(previous)
        if kind == "SentencePieceTokenizer":
            model_vocab_size = sentencepiece_model_vocab_size(flags.tokenizer_model)
        return CoreTokenizer(inner, kind, source, model_vocab_size, require_eod=require_eod)
    except TokenizerError:
        raise
    except AssertionError as e:
        hint = ""
        if kind == "TikTokenizer":
            hint = (f": --vocab-size ({flags.vocab_size or 2 ** 17}) must be more than --tiktoken-num-special-tokens "
                    f"({flags.tiktoken_num_special_tokens}) and at most that plus the ranks in the file, and "
                    f"--tokenizer-special-tokens must hold <unk> <s> </s> <mask> <pad> <cls> <sep>")
        raise TokenizerError(f"--tokenizer-type {kind} {source}: {_first_line(e) if str(e) else 'rejected'}"
                             f"{hint}") from None
    except Exception as e:  # transformers / sentencepiece / tiktoken raise their own types for bad files
        raise TokenizerError(f"cannot load --tokenizer-type {kind} from {source}: {_first_line(e)}") from None


def tokenizer_from_flags(flags: Tokenizer, require_eod: bool = True):
    """The tokenizer the flags name: ``--tokenizer-type`` (above), else the local HF tokenizer of
    ``--tokenizer-model`` (data/tokenizer.py). TokenizerError with one line when it cannot be loaded."""
    if flags.tokenizer_type:
        return build_tokenizer(flags, require_eod)
    from mtmegatron.data.tokenizer import load_tokenizer

    return load_tokenizer(flags.tokenizer_model, require_eod=require_eod)


def tokenizer_flags_text(flags: Tokenizer, tokenizer) -> str:
    """The tokenizer flags that reproduce ``tokenizer`` for a pretrain run (printed by preprocess)."""
    if not flags.tokenizer_type:
        return f"--tokenizer-model {os.path.dirname(tokenizer.source)}"
    parts = [f"--tokenizer-type {flags.tokenizer_type}"]
    for flag in ("tokenizer_model", "vocab_file", "merge_file", "tiktoken_pattern"):
        if getattr(flags, flag):
            parts.append(f"--{flag.replace('_', '-')} {getattr(flags, flag)}")
    if flags.tokenizer_type == "TikTokenizer":
        parts.append(f"--tiktoken-num-special-tokens {flags.tiktoken_num_special_tokens}")
    if flags.tokenizer_type in ("TikTokenizer", "NullTokenizer") and flags.vocab_size:
        parts.append(f"--vocab-size {flags.vocab_size}")
    return " ".join(parts)
