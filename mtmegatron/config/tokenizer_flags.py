"""Megatron-LM's tokenizer flags (``--tokenizer-type`` and the files each type reads) and their rules.

Shared by ``mtmegatron.pretrain`` (called from config/arguments.py) and ``mtmegatron preprocess``, so data
is preprocessed and trained with the same tokenizer from the same flags. Option strings, dests, types,
choices and defaults are Megatron-LM core_v0.16.1's (``_add_tokenizer_args``); ``--vocab-size`` is registered
by the caller (the model flags own it). Which files each type needs, and the types refused here with the
reason, are checked before anything is loaded; the tokenizer itself is built by data/tokenizer_build.py.
May assume: argparse only; ``error`` is the caller's one-line user-error exception type.
"""

from __future__ import annotations

import argparse
import os

from mtmegatron.models import families

TOKENIZER_TYPES = ["BertWordPieceLowerCase", "BertWordPieceCase", "GPT2BPETokenizer", "SentencePieceTokenizer",
                   "GPTSentencePieceTokenizer", "HuggingFaceTokenizer", "Llama2Tokenizer", "TikTokenizer",
                   "MultimodalTokenizer", "NullTokenizer", "NullMultimodalTokenizer", "SFTTokenizer"]

# Megatron-LM's types this package does not build, each with the one-line reason given to the user.
REFUSED_TYPES = {
    "BertWordPieceLowerCase": "BERT models are not supported; GPT-style only",
    "BertWordPieceCase": "BERT models are not supported; GPT-style only",
    "MultimodalTokenizer": "LLaVA (--model llava) reads --tokenizer-model DIR with its own chat templates; "
                           "Megatron-LM's MultimodalTokenizer prompt formats are not supported",
    "NullMultimodalTokenizer": "multimodal mock data is not supported; --model llava uses its embedded dataset",
    "SFTTokenizer": "SFT prompt formats are not supported; pretraining only",
}

SENTENCEPIECE_TYPES = ("SentencePieceTokenizer", "GPTSentencePieceTokenizer", "Llama2Tokenizer")


def add_tokenizer_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("tokenizer (Megatron-LM's flags; see docs/data_and_checkpoints.md)")
    g.add_argument("--tokenizer-type", type=str, default=None, choices=TOKENIZER_TYPES,
                   help="tokenizer kind, as in Megatron-LM (default: a local HF tokenizer directory given by "
                        "--tokenizer-model, or the embedded corpus's own BPE)")
    g.add_argument("--tokenizer-model", type=str, default=None,
                   help="HuggingFaceTokenizer: a directory (or its tokenizer.json); SentencePiece/Llama2: the .model "
                        "file; TikTokenizer: the tiktoken vocabulary (.json); no --tokenizer-type: a local HF "
                        "tokenizer directory")
    g.add_argument("--vocab-file", type=str, default=None, help="GPT2BPETokenizer: the vocab.json file")
    g.add_argument("--merge-file", type=str, default=None, help="GPT2BPETokenizer: the merges.txt file")
    g.add_argument("--tokenizer-special-tokens", type=str, nargs="+", default=None,
                   help="special tokens: added to a HuggingFace tokenizer; TikTokenizer's list (must hold <unk> "
                        "<s> </s> <mask> <pad> <cls> <sep>); SentencePiece with --tokenizer-sentencepiece-legacy")
    g.add_argument("--tiktoken-pattern", type=str, default=None,
                   help="TikTokenizer's pre-tokenization pattern: v1 or v2")
    g.add_argument("--tiktoken-num-special-tokens", type=int, default=1000,
                   help="TikTokenizer: ids reserved for special tokens before the BPE ranks")
    g.add_argument("--tiktoken-special-tokens", type=str, nargs="+", default=None,
                   help="deprecated spelling of --tokenizer-special-tokens (as in Megatron-LM)")
    g.add_argument("--tokenizer-sentencepiece-legacy", action="store_true", default=False,
                   help="SentencePiece wrapper's legacy behaviour (allows --tokenizer-special-tokens)")
    g.add_argument("--tokenizer-hf-use-fast", action="store_true", default=False,
                   help="HuggingFaceTokenizer: ask transformers for the fast tokenizer")
    g.add_argument("--tokenizer-hf-include-special-tokens", action="store_true", default=False,
                   help="HuggingFaceTokenizer: tokenizing adds the tokenizer's own special tokens (e.g. BOS)")
    g.add_argument("--trust-remote-code", action="store_true", default=False,
                   help="HuggingFaceTokenizer: let transformers run the tokenizer's own code")


def _need_file(flag: str, path: str | None, what: str, kind: str, error) -> None:
    if not path:
        raise error(f"--tokenizer-type {kind} needs {flag} ({what})")
    if not os.path.isfile(path):
        raise error(f"{flag} {path}: no such file ({what} for --tokenizer-type {kind})")


def _looks_local(path: str) -> bool:
    """A path the user meant on this machine (not an HF hub id such as ``org/name``)."""
    return os.path.isabs(path) or path.startswith(("./", "../", "~")) or os.path.exists(path)


def check_tokenizer_args(args: argparse.Namespace, error: type[Exception]) -> None:
    """Megatron-LM's requirements of each ``--tokenizer-type``, each as one message; the refused types with
    their reason. Also applies Megatron-LM's deprecated ``--tiktoken-special-tokens`` spelling."""
    if args.tiktoken_special_tokens and not args.tokenizer_special_tokens:
        args.tokenizer_special_tokens = args.tiktoken_special_tokens
    kind = args.tokenizer_type
    if kind is None:
        for flag in ("vocab_file", "merge_file", "tiktoken_pattern", "tokenizer_special_tokens"):
            if getattr(args, flag):
                raise error(f"--{flag.replace('_', '-')} needs a --tokenizer-type that reads it")
        return
    if kind in REFUSED_TYPES:
        raise error(f"--tokenizer-type {kind}: {REFUSED_TYPES[kind]}")
    if families.of(args).is_multimodal:
        raise error("--tokenizer-type is for GPT-style models; --model llava reads --tokenizer-model DIR")
    if kind == "GPT2BPETokenizer":
        _need_file("--vocab-file", args.vocab_file, "GPT-2 vocab.json", kind, error)
        _need_file("--merge-file", args.merge_file, "GPT-2 merges.txt", kind, error)
    elif kind in SENTENCEPIECE_TYPES:
        _need_file("--tokenizer-model", args.tokenizer_model, "a SentencePiece .model file", kind, error)
        if args.tokenizer_special_tokens and not args.tokenizer_sentencepiece_legacy:
            raise error("--tokenizer-special-tokens with a SentencePiece tokenizer needs "
                        "--tokenizer-sentencepiece-legacy (megatron-core's rule)")
    elif kind == "TikTokenizer":
        _need_file("--tokenizer-model", args.tokenizer_model, "a tiktoken vocabulary .json", kind, error)
        if args.tiktoken_pattern not in ("v1", "v2"):
            raise error(f"--tokenizer-type TikTokenizer needs --tiktoken-pattern v1 or v2 "
                        f"(got {args.tiktoken_pattern})")
    elif kind == "HuggingFaceTokenizer":
        if not args.tokenizer_model:
            raise error("--tokenizer-type HuggingFaceTokenizer needs --tokenizer-model (a tokenizer directory, its "
                        "tokenizer.json, or an HF hub name)")
        if _looks_local(args.tokenizer_model) and not os.path.exists(os.path.expanduser(args.tokenizer_model)):
            raise error(f"--tokenizer-model {args.tokenizer_model}: no such file or directory")
    elif kind == "NullTokenizer":
        if not args.vocab_size:
            raise error("--tokenizer-type NullTokenizer needs --vocab-size (ids 0..N-1 are text, N is "
                        "end-of-document)")
    if kind != "HuggingFaceTokenizer":
        for flag in ("tokenizer_hf_use_fast", "tokenizer_hf_include_special_tokens", "trust_remote_code"):
            if getattr(args, flag):
                raise error(f"--{flag.replace('_', '-')} is for --tokenizer-type HuggingFaceTokenizer")
