"""The command line of ``mtmegatron preprocess`` (Megatron-LM ``tools/preprocess_data.py``'s flags) and its checks.

``build_parser`` registers the flags (on the ``preprocess`` subcommand of mtmegatron/cli.py, or on a parser of its
own); a bad flag is one line and exit status 2. ``run(args)`` checks the parsed flags (``check_preprocess_args``:
one ``ValueError`` line each, printed with the command's prefix, exit status 2) and hands them to
data/preprocess.py, which does the work. The tokenizer flags are pretrain's (config/tokenizer_flags.py).
May assume: argparse only; inputs and outputs are checked here, before any tokenizer is loaded.
"""

from __future__ import annotations

import argparse
import os
import sys

from mtmegatron.config.tokenizer_flags import add_tokenizer_args, check_tokenizer_args

DESCRIPTION = "``mtmegatron preprocess``: JSONL or plain text -> a megatron-core indexed dataset (``.bin`` + ``.idx``)."


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    p = parser or argparse.ArgumentParser(prog="mtmegatron preprocess", description=DESCRIPTION)
    p.error = _one_line_error  # a bad flag is one line (no usage dump), exit 2
    add_preprocess_args(p)
    return p


def add_preprocess_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("input and output (Megatron-LM tools/preprocess_data.py's flags)")
    g.add_argument("--input", nargs="+", required=True, help="JSONL (.jsonl[.gz|.xz]) or plain text files")
    g.add_argument("--output-prefix", required=True, help="writes <prefix>_<key>_document.bin/.idx per key")
    g.add_argument("--json-keys", nargs="+", default=["text"], help="JSONL fields to tokenize, one dataset each")
    g.add_argument("--append-eod", action="store_true", default=False,
                   help="end each document with the tokenizer's end-of-document token (GPT pretraining wants it)")
    g.add_argument("--workers", type=int, default=max(1, min(4, os.cpu_count() or 1)),
                   help="tokenizing processes (default: up to 4 of this machine's cores)")
    g.add_argument("--log-interval", type=int, default=1000,
                   help="accepted for Megatron-LM scripts; progress is a live bar here")
    g.add_argument("--split-sentences", action="store_true", default=False, help="not supported (BERT-style data)")
    g.add_argument("--partitions", type=int, default=1, help="only 1: --workers parallelizes one pass")
    add_tokenizer_args(p)
    p.add_argument("--vocab-size", type=int, default=None, help="NullTokenizer / TikTokenizer vocabulary size")
    p.add_argument("--train-tokenizer", type=int, metavar="VOCAB", default=None,
                   help="no --tokenizer-type/--tokenizer-model: train a byte-level BPE of this vocabulary size on "
                        "the input; saved to <prefix>_tokenizer/")
    # config/tokenizer_flags.py's checks ask the run's family (a Namespace without --model is Megatron-LM's gpt)
    p.set_defaults(model=None)


def _one_line_error(message: str):
    print(f"mtmegatron preprocess: error: {message} (see --help)", file=sys.stderr)
    sys.exit(2)


def check_preprocess_args(args: argparse.Namespace) -> None:
    """Raise ValueError with one line for a flag this command cannot honour."""
    missing = [path for path in args.input if not os.path.isfile(path)]
    if missing:
        raise ValueError(f"no such input file: {', '.join(missing)}")
    above = os.path.dirname(os.path.abspath(args.output_prefix))
    while not os.path.exists(above):
        above = os.path.dirname(above)
    if not os.path.isdir(above):
        raise ValueError(f"--output-prefix {args.output_prefix}: {above} is a file, not a directory")
    if args.split_sentences:
        raise ValueError("--split-sentences is not supported: GPT-style documents only (BERT models are not)")
    if args.partitions != 1:
        raise ValueError("--partitions must be 1: --workers processes tokenize one pass, in input order")
    if args.workers < 1:
        raise ValueError("--workers must be >= 1")
    if args.train_tokenizer is not None:
        if args.tokenizer_type or args.tokenizer_model:
            raise ValueError("--train-tokenizer trains a new tokenizer; do not also give --tokenizer-type/"
                             "--tokenizer-model")
    elif not (args.tokenizer_type or args.tokenizer_model):
        raise ValueError("name a tokenizer: --tokenizer-type (Megatron-LM's flags), --tokenizer-model DIR (a local "
                         "HF tokenizer) or --train-tokenizer VOCAB")
    check_tokenizer_args(args, ValueError)


def run(args: argparse.Namespace) -> int:
    """Preprocess (data/preprocess.run) after ``check_preprocess_args``, inside the command's one error boundary
    (a bad flag: one line, 2)."""
    from mtmegatron.data import preprocess

    return preprocess.run(args, check=check_preprocess_args)


def main(argv=None) -> int:
    return run(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
