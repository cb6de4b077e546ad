"""Flags of the production training loop: real data and validation, checkpoint retention, fault handling,
and what a run leaves behind (tensorboard events, loss plot, sample text). Megatron-LM spellings where
Megatron-LM has the flag.

Kept apart from arguments.py so that file stays the model/parallelism contract; ``add_run_args`` and
``check_run_args`` are called from there.
May assume: called by arguments.build_parser / arguments.CHECKS only.
"""

from __future__ import annotations

import argparse

from mtmegatron.utils.errors import ConfigError


def add_run_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("data, validation, fault tolerance, run outputs")
    g.add_argument("--data-path", nargs="*", default=None,
                   help="indexed dataset prefix(es) from `mtmegatron preprocess` (weights from their sizes), or a "
                        "weighted blend 'W1 P1 W2 P2 ...' (default without --mock-data: the embedded corpus)")
    g.add_argument("--split", type=str, default=None,
                   help="train,valid,test proportions of --data-path, e.g. 90,5,5 (default: 969, 30, 1)")
    g.add_argument("--data-cache-path", default=None,
                   help="where megatron-core caches sample indices (default: beside the data, cache/)")
    g.add_argument("--eval-interval", type=int, default=None,
                   help="validation loss every N iterations and at the end (default: train-iters/10)")
    g.add_argument("--eval-iters", type=int, default=4, help="global batches per validation")
    g.add_argument("--keep-last", type=int, default=None, help="keep only the N newest checkpoints")
    g.add_argument("--max-skipped-steps", type=int, default=None,
                   help="stop when more than N steps were skipped for inf/nan loss or gradients")
    g.add_argument("--tensorboard-dir", default=None, help="default: <log-dir>/tensorboard")
    g.add_argument("--num-samples", type=int, default=3,
                   help="greedy-decoded continuations printed at the end (0: none)")
    g.add_argument("--sample-tokens", type=int, default=40, help="tokens generated per sample")
    g.add_argument("--sample-prompt", action="append", default=None,
                   help="a prompt to continue (repeatable; default: built-in prompts)")


def check_run_args(args: argparse.Namespace) -> None:
    if args.tokenizer_model and args.mock_data and not args.tokenizer_type:
        raise ConfigError("--tokenizer-model is for real data; --mock-data needs no tokenizer (or name its "
                          "--tokenizer-type)")
    if args.eval_interval is not None and args.eval_interval <= 0:
        raise ConfigError("--eval-interval must be positive")
    if args.eval_iters < 0:
        raise ConfigError("--eval-iters must be >= 0")
    args.embedded_corpus = not (args.mock_data or args.data_path or args.train_data_path or args.valid_data_path
                                or args.test_data_path)  # the built-in sample prompts are verses of it
    if not args.mock_data and args.eval_interval is None:
        args.eval_interval = max(1, args.train_iters // 10)
    if args.keep_last is not None and (args.keep_last < 1 or not args.save):
        raise ConfigError("--keep-last needs a value >= 1 and --save DIR")
    if args.max_skipped_steps is not None and args.max_skipped_steps < 0:
        raise ConfigError("--max-skipped-steps must be >= 0")
    if args.num_samples < 0 or args.sample_tokens < 1:
        raise ConfigError("--num-samples must be >= 0 and --sample-tokens >= 1")
    if args.sample_prompt:
        args.num_samples = max(args.num_samples, len(args.sample_prompt))
