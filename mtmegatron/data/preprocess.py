"""``mtmegatron preprocess``: JSONL or plain text -> a megatron-core indexed dataset (``.bin`` + ``.idx``).

The Megatron-LM ``tools/preprocess_data.py`` contract and flags: documents are tokenized in ``--workers``
processes (order kept), each followed by the end-of-document token with ``--append-eod``, and written with
megatron-core's ``IndexedDatasetBuilder`` to ``<output-prefix>_<key>_document.{bin,idx}``, one dataset per
``--json-keys`` key. The command line is config/preprocess_flags.py's (it parses and checks the flags, then calls
``run`` with them). Tokenizer: Megatron-LM's ``--tokenizer-type`` flags (config/tokenizer_flags.py, the same
as pretrain's), ``--tokenizer-model DIR`` alone (a local HF tokenizer), or ``--train-tokenizer VOCAB`` (a
byte-level BPE trained on the input, saved to ``<output-prefix>_tokenizer/``).
Files are written under temporary names and renamed when complete (the ``.idx`` last), so a killed run never
leaves a dataset that looks whole.
May assume: inputs are UTF-8; ``.gz``/``.xz``/``.bz2`` inputs are decompressed on the fly.
"""

from __future__ import annotations

import argparse
import bz2
import gzip
import json
import lzma
import multiprocessing
import os
import sys
from typing import Iterator

import numpy as np
from tqdm import tqdm

from mtmegatron.data.tokenizer import TokenizerError, train_bpe

_OPENERS = {".gz": gzip.open, ".xz": lzma.open, ".bz2": bz2.open}


def _open_text(path: str):
    opener = _OPENERS.get(os.path.splitext(path)[1], open)
    return opener(path, "rt", encoding="utf-8")


def _is_jsonl(path: str) -> bool:
    stem = path
    for suffix in _OPENERS:
        if stem.endswith(suffix):
            stem = stem[: -len(suffix)]
    return stem.endswith((".jsonl", ".json"))


class InputError(ValueError):
    """An input file that cannot be read as asked; the message names it and says why."""


def iter_documents(paths: list[str], key: str) -> Iterator[str]:
    """Documents of every input: one per JSONL line (field ``key``), or blank-line-separated paragraphs of
    plain text files. An input that is not UTF-8, a compressed file that is not (or not wholly) of its kind, or
    one that cannot be read is an InputError naming it."""
    for path in paths:
        try:
            yield from _documents(path, key)
        except UnicodeDecodeError:
            raise InputError(f"{path}:{_first_undecodable_line(path)}: not UTF-8 text (inputs must be UTF-8)") \
                from None
        except (EOFError, lzma.LZMAError, gzip.BadGzipFile, OSError) as e:
            kind = os.path.splitext(path)[1]
            if isinstance(e, OSError) and not isinstance(e, gzip.BadGzipFile) and kind not in _OPENERS:
                raise InputError(f"{path}: {e.strerror or e}") from None
            raise InputError(f"{path}: not a whole {kind[1:]} file ({e or 'it ends early'})") from None


def _documents(path: str, key: str) -> Iterator[str]:
    with _open_text(path) as f:
        if _is_jsonl(path):
            for number, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    text = json.loads(line)[key]
                except (json.JSONDecodeError, KeyError, TypeError):
                    raise ValueError(f"{path}:{number}: not a JSON object with a {key!r} field") from None
                if not isinstance(text, str):
                    raise ValueError(f"{path}:{number}: field {key!r} is a {type(text).__name__}, not text")
                yield text
        else:
            paragraph: list[str] = []
            for line in f:
                if line.strip():
                    paragraph.append(line.rstrip("\n"))
                elif paragraph:
                    yield "\n".join(paragraph)
                    paragraph = []
            if paragraph:
                yield "\n".join(paragraph)


def _first_undecodable_line(path: str) -> int:
    opener = _OPENERS.get(os.path.splitext(path)[1], open)
    with opener(path, "rb") as f:
        for number, raw in enumerate(f, 1):
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError:
                return number
    return 0


_worker_tokenizer = None  # set before the workers fork: each inherits the loaded tokenizer


def _encode(text: str) -> list[int] | str:
    """The document's token ids, or why the tokenizer refused it (e.g. NullTokenizer given words, not ids)."""
    try:
        return _worker_tokenizer.tokenize(text)
    except (ValueError, TypeError) as e:
        return str(e)


def output_prefix(prefix: str, key: str = "text") -> str:
    """The dataset prefix (what ``--data-path`` takes) that ``preprocess`` writes for ``--output-prefix``."""
    return f"{prefix}_{key}_document"


def preprocess(inputs: list[str], prefix: str, tokenizer, key: str = "text", workers: int = 1,
               append_eod: bool = True, progress: bool = True) -> str:
    """Tokenize ``inputs`` into ``<prefix>_<key>_document.{bin,idx}``; returns that dataset prefix."""
    from megatron.core.datasets.indexed_dataset import DType, IndexedDatasetBuilder

    out = output_prefix(prefix, key)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    tmp = f"{out}.tmp{os.getpid()}"
    builder = IndexedDatasetBuilder(tmp + ".bin", dtype=DType.optimal_dtype(tokenizer.vocab_size))
    num_docs = num_tokens = 0
    bar = tqdm(desc=f"tokenizing -> {os.path.basename(out)}", unit=" docs",
               disable=not progress or not sys.stderr.isatty(), file=sys.stderr)
    global _worker_tokenizer
    _worker_tokenizer = tokenizer
    try:
        # fork: workers start in milliseconds (spawn would re-import torch in each) and inherit the tokenizer
        with multiprocessing.get_context("fork").Pool(workers) if workers > 1 else _InProcess(tokenizer) as pool:
            for number, ids in enumerate(pool.imap(_encode, iter_documents(inputs, key), chunksize=16), 1):
                if isinstance(ids, str):  # the tokenizer's complaint about this document
                    raise InputError(f"{', '.join(inputs)}: document {number} ({key!r}) cannot be tokenized: {ids}")
                if append_eod:
                    ids = ids + [tokenizer.eod]
                if not ids:
                    continue
                builder.add_document(np.asarray(ids), [len(ids)])
                num_docs += 1
                num_tokens += len(ids)
                bar.update(1)
                bar.set_postfix(tokens=num_tokens, refresh=False)
        bar.close()
        if num_docs == 0:
            raise ValueError(f"no documents found in {', '.join(inputs)}")
        builder.finalize(tmp + ".idx")
    except BaseException:
        builder.data_file.close()
        for part in (tmp + ".bin", tmp + ".idx"):  # nothing half-written stays behind
            if os.path.exists(part):
                os.remove(part)
        raise
    os.replace(tmp + ".bin", out + ".bin")
    os.replace(tmp + ".idx", out + ".idx")
    return out


class _InProcess:
    """``Pool``'s imap, in this process (one worker: no process start-up cost)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def imap(self, fn, items, chunksize=1):
        return (fn(item) for item in items)


def run(args: argparse.Namespace, check=None) -> int:
    """The work of ``mtmegatron preprocess`` for flags config/preprocess_flags.py parsed: ``check(args)`` first (its
    flag checks, raising ValueError), then the work; 0, or 2 after one line on stderr for a flag, an input, a
    tokenizer or an output that fails (the command's one error boundary)."""
    from mtmegatron.data.section import Tokenizer
    from mtmegatron.data.tokenizer_build import tokenizer_flags_text, tokenizer_from_flags

    try:
        if check is not None:
            check(args)
        if args.train_tokenizer is None:
            tokenizer = tokenizer_from_flags(Tokenizer.of(args), require_eod=args.append_eod)
        else:
            tokenizer = train_bpe(iter_documents(args.input, args.json_keys[0]), args.train_tokenizer,
                                  f"{args.output_prefix}_tokenizer")
            print(f"trained a byte-level BPE ({tokenizer.vocab_size} tokens): {tokenizer.source}")
        outputs = [preprocess(args.input, args.output_prefix, tokenizer, key, args.workers,
                              append_eod=args.append_eod) for key in args.json_keys]
    except (TokenizerError, ValueError) as e:
        print(f"mtmegatron preprocess: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # an output that cannot be written (a full disk, a prefix under a file)
        from mtmegatron.utils.errors import describe_os_error

        print(f"mtmegatron preprocess: error: {describe_os_error(e)}", file=sys.stderr)
        return 2
    if not args.append_eod:
        print("note: no end-of-document token between documents (pass --append-eod for GPT pretraining, as in "
              "Megatron-LM)", file=sys.stderr)
    flags = tokenizer_flags_text(Tokenizer.of(args), tokenizer)
    for out in outputs:
        print(f"wrote {out}.bin and {out}.idx; train with --data-path {out} {flags}")
    return 0
