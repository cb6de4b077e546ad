"""``mtmegatron preprocess``: JSONL or plain text -> a megatron-core indexed dataset (``.bin`` + ``.idx``).

The Megatron-LM ``tools/preprocess_data.py`` contract: documents are tokenized in worker processes (order
kept), each followed by the end-of-document token, and written with megatron-core's ``IndexedDatasetBuilder``
to ``<output-prefix>_<key>_document.{bin,idx}``. Tokenizer: ``--tokenizer-model DIR`` (a local HF tokenizer)
or ``--train-tokenizer VOCAB`` (a byte-level BPE trained on the input, saved to ``<output-prefix>_tokenizer/``).
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

from mtmegatron.data.tokenizer import HFTokenizer, TokenizerError, load_tokenizer, train_bpe

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


def iter_documents(paths: list[str], key: str) -> Iterator[str]:
    """Documents of every input: one per JSONL line (field ``key``), or blank-line-separated paragraphs of
    plain text files."""
    for path in paths:
        with _open_text(path) as f:
            if _is_jsonl(path):
                for number, line in enumerate(f, 1):
                    if not line.strip():
                        continue
                    try:
                        yield json.loads(line)[key]
                    except (json.JSONDecodeError, KeyError, TypeError):
                        raise ValueError(f"{path}:{number}: not a JSON object with a {key!r} field") from None
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


_worker_tokenizer: HFTokenizer | None = None


def _init_worker(tokenizer_file: str) -> None:
    global _worker_tokenizer
    _worker_tokenizer = load_tokenizer(tokenizer_file)


def _encode(text: str) -> list[int]:
    return _worker_tokenizer.tokenize(text)


def output_prefix(prefix: str, key: str = "text") -> str:
    """The dataset prefix (what ``--data-path`` takes) that ``preprocess`` writes for ``--output-prefix``."""
    return f"{prefix}_{key}_document"


def preprocess(inputs: list[str], prefix: str, tokenizer: HFTokenizer, key: str = "text", workers: int = 1,
               append_eod: bool = True, progress: bool = True) -> str:
    """Tokenize ``inputs`` into ``<prefix>_<key>_document.{bin,idx}``; returns that dataset prefix."""
    from megatron.core.datasets.indexed_dataset import DType, IndexedDatasetBuilder

    out = output_prefix(prefix, key)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    tmp = f"{out}.tmp{os.getpid()}"
    builder = IndexedDatasetBuilder(tmp + ".bin", dtype=DType.optimal_dtype(tokenizer.vocab_size))
    num_docs = num_tokens = 0
    bar = tqdm(desc=f"tokenizing -> {os.path.basename(out)}", unit=" docs", disable=not progress,
               file=sys.stderr)
    # fork: workers start in milliseconds (spawn would re-import torch in each)
    with multiprocessing.get_context("fork").Pool(workers, _init_worker, (tokenizer.source,)) \
            if workers > 1 else _InProcess(tokenizer) as pool:
        for ids in pool.imap(_encode, iter_documents(inputs, key), chunksize=16):
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
    os.replace(tmp + ".bin", out + ".bin")
    os.replace(tmp + ".idx", out + ".idx")
    return out


class _InProcess:
    """``Pool``'s imap, in this process (one worker: no process start-up cost)."""

    def __init__(self, tokenizer: HFTokenizer):
        self.tokenizer = tokenizer

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def imap(self, fn, items, chunksize=1):
        return (self.tokenizer.tokenize(item) for item in items)


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    p = parser or argparse.ArgumentParser(prog="mtmegatron preprocess", description=__doc__.split("\n")[0])
    p.add_argument("--input", nargs="+", required=True, help="JSONL (.jsonl[.gz|.xz]) or plain text files")
    p.add_argument("--output-prefix", required=True, help="writes <prefix>_<key>_document.bin/.idx")
    p.add_argument("--json-keys", default="text", help="JSONL field holding the document text")
    tok = p.add_mutually_exclusive_group(required=True)
    tok.add_argument("--tokenizer-model", help="a local HF tokenizer (directory with tokenizer.json, or the file)")
    tok.add_argument("--train-tokenizer", type=int, metavar="VOCAB",
                     help="train a byte-level BPE of this vocabulary size on the input; saved to "
                          "<prefix>_tokenizer/")
    p.add_argument("--workers", type=int, default=max(1, min(4, os.cpu_count() or 1)))
    p.add_argument("--no-append-eod", action="store_true", help="do not end each document with <|endoftext|>")
    return p


def run(args: argparse.Namespace) -> int:
    missing = [path for path in args.input if not os.path.isfile(path)]
    if missing:
        print(f"mtmegatron preprocess: error: no such input file: {', '.join(missing)}", file=sys.stderr)
        return 2
    try:
        if args.tokenizer_model:
            tokenizer = load_tokenizer(args.tokenizer_model)
        else:
            tokenizer = train_bpe(iter_documents(args.input, args.json_keys), args.train_tokenizer,
                                  f"{args.output_prefix}_tokenizer")
            print(f"trained a byte-level BPE ({tokenizer.vocab_size} tokens): {tokenizer.source}")
        out = preprocess(args.input, args.output_prefix, tokenizer, args.json_keys, args.workers,
                         append_eod=not args.no_append_eod)
    except (TokenizerError, ValueError) as e:
        print(f"mtmegatron preprocess: error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {out}.bin and {out}.idx; train with --data-path {out} --tokenizer-model "
          f"{os.path.dirname(tokenizer.source)}")
    return 0


def main(argv=None) -> int:
    return run(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
