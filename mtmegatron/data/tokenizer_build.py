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
May assume: the flags passed check_tokenizer_args; nothing here starts a process group.
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import os
import warnings

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


def _core_args(args: argparse.Namespace, **changes) -> argparse.Namespace:
    """The namespace megatron-core's build_tokenizer reads (every field it touches present)."""
    core = copy.copy(args)
    for field, default in (("tokenizer_metadata", None), ("tokenizer_special_tokens", None),
                           ("tokenizer_hf_use_fast", False), ("trust_remote_code", False),
                           ("tokenizer_hf_include_special_tokens", False), ("tokenizer_sentencepiece_legacy", False),
                           ("tiktoken_pattern", None), ("tiktoken_num_special_tokens", 1000), ("vocab_size", None),
                           ("vocab_file", None), ("merge_file", None)):
        if not hasattr(core, field):
            setattr(core, field, default)
    for field, value in changes.items():
        setattr(core, field, value)
    return core


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


def _gpt2_bpe(args: argparse.Namespace):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    from mtmegatron.data.tokenizer import HFTokenizer

    try:
        with open(args.vocab_file, encoding="utf-8") as f:
            vocab = json.load(f)
        bpe = models.BPE.from_file(args.vocab_file, args.merge_file)
    except Exception as e:  # json or the tokenizers library's own Exception type
        raise TokenizerError(f"--vocab-file {args.vocab_file} / --merge-file {args.merge_file} are not a GPT-2 "
                             f"BPE vocab.json + merges.txt: {_first_line(e)}") from None
    if GPT2_EOD not in vocab:
        raise TokenizerError(f"--vocab-file {args.vocab_file} has no {GPT2_EOD} (GPT-2's end-of-document token)")
    tokenizer = Tokenizer(bpe)
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    return HFTokenizer(tokenizer, [args.vocab_file, args.merge_file], eod=vocab[GPT2_EOD],
                       kind="GPT2BPETokenizer")


def build_tokenizer(args: argparse.Namespace, require_eod: bool = True):
    """The tokenizer of ``args.tokenizer_type`` (flags already checked); TokenizerError with one line when the
    files cannot be loaded as that type. ``require_eod``: it must have an end-of-document token (preprocess
    without ``--append-eod`` needs none)."""
    kind = args.tokenizer_type
    if kind == "GPT2BPETokenizer":
        return _gpt2_bpe(args)
    from megatron.core.tokenizers.text.utils.build_tokenizer import build_tokenizer as core_build_tokenizer

    changes, source, model_vocab_size = {}, args.tokenizer_model, None
    if kind == "HuggingFaceTokenizer":
        path = os.path.expanduser(args.tokenizer_model)
        if os.path.isfile(path):  # a tokenizer.json: transformers loads the directory holding it
            path = os.path.dirname(os.path.abspath(path))
        changes["tokenizer_model"] = source = path
    elif kind == "NullTokenizer":
        source = f"NullTokenizer(--vocab-size {args.vocab_size})"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            previous = logging.root.manager.disable
            logging.disable(max(previous, logging.WARNING))  # transformers' notes on tokenizer classes, per rank
            try:
                inner = core_build_tokenizer(_core_args(args, **changes))
            finally:
                logging.disable(previous)
        if kind == "SentencePieceTokenizer":
            model_vocab_size = sentencepiece_model_vocab_size(args.tokenizer_model)
        return CoreTokenizer(inner, kind, source, model_vocab_size, require_eod=require_eod)
    except TokenizerError:
        raise
    except AssertionError as e:
        hint = ""
        if kind == "TikTokenizer":
            hint = (f": --vocab-size ({args.vocab_size or 2 ** 17}) must be more than --tiktoken-num-special-tokens "
                    f"({args.tiktoken_num_special_tokens}) and at most that plus the ranks in the file, and "
                    f"--tokenizer-special-tokens must hold <unk> <s> </s> <mask> <pad> <cls> <sep>")
        raise TokenizerError(f"--tokenizer-type {kind} {source}: {_first_line(e) if str(e) else 'rejected'}"
                             f"{hint}") from None
    except Exception as e:  # transformers / sentencepiece / tiktoken raise their own types for bad files
        raise TokenizerError(f"cannot load --tokenizer-type {kind} from {source}: {_first_line(e)}") from None


def tokenizer_from_flags(args: argparse.Namespace, require_eod: bool = True):
    """The tokenizer the flags name: ``--tokenizer-type`` (above), else the local HF tokenizer of
    ``--tokenizer-model`` (data/tokenizer.py). TokenizerError with one line when it cannot be loaded."""
    if args.tokenizer_type:
        return build_tokenizer(args, require_eod)
    from mtmegatron.data.tokenizer import load_tokenizer

    return load_tokenizer(args.tokenizer_model, require_eod=require_eod)


def tokenizer_flags_text(args: argparse.Namespace, tokenizer) -> str:
    """The tokenizer flags that reproduce ``tokenizer`` for a pretrain run (printed by preprocess)."""
    if not args.tokenizer_type:
        return f"--tokenizer-model {os.path.dirname(tokenizer.source)}"
    parts = [f"--tokenizer-type {args.tokenizer_type}"]
    for flag in ("tokenizer_model", "vocab_file", "merge_file", "tiktoken_pattern"):
        if getattr(args, flag):
            parts.append(f"--{flag.replace('_', '-')} {getattr(args, flag)}")
    if args.tokenizer_type == "TikTokenizer":
        parts.append(f"--tiktoken-num-special-tokens {args.tiktoken_num_special_tokens}")
    if args.tokenizer_type in ("TikTokenizer", "NullTokenizer") and args.vocab_size:
        parts.append(f"--vocab-size {args.vocab_size}")
    return " ".join(parts)
