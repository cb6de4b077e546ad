"""What ``mtmegatron.pretrain --sft`` reads before any process group: tokenizer, template, checked data.

No ``--data-path``: the embedded arithmetic task (task.py) with its own tokenizer and held-out questions.
``--data-path F1.jsonl [F2.jsonl ...]``: those files and ``--tokenizer-model DIR``. Every problem (a bad
record, a missing file, a template that cannot be used, a tokenizer larger than the vocabulary) is one
``ConfigError``; so is data that the cut to ``--seq-length`` leaves without any assistant token. The share of
assistant tokens the cut keeps is in the summary, with a warning when it loses more than 5% of them or leaves
a conversation without its answer.
May assume: flags validated (config/sft_flags.py); runs on every rank.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass

from mtmegatron.data.tokenizer import HFTokenizer, TokenizerError, load_tokenizer
from mtmegatron.sft.dataset import SFTData, SFTDataError, prepare as prepare_data, read_conversations
from mtmegatron.sft.section import Sft
from mtmegatron.sft.templates import SPECIAL_TOKENS, ChatTemplate, TemplateError
from mtmegatron.utils.errors import ConfigError

WARN_TARGETS_LOST = 0.05  # a start-up warning when the cut to --seq-length removes more of the assistant tokens


@dataclass
class SFTInputs:
    tokenizer: HFTokenizer
    template: ChatTemplate
    data: SFTData
    held_out: list[list[dict]] | None  # conversations whose assistant answers are scored by exact match
    summary: str
    padded_rows: int  # the padded layout's rows per micro-batch: mbs x the fullest bin's conversations

    @property
    def pad_id(self) -> int:
        return self.tokenizer.pad if self.tokenizer.pad >= 0 else self.tokenizer.eod


def prepare(args: argparse.Namespace, progress: bool) -> SFTInputs:
    held_out_file = None
    try:
        if not args.data_path:
            from mtmegatron.sft import task

            train_file, held_out_file, tokenizer_dir = task.prepare(
                SPECIAL_TOKENS.get(args.sft_tokenizer_prompt_format, ()))
            args.data_path = [train_file]
            args.tokenizer_model = args.tokenizer_model or tokenizer_dir
        elif not args.tokenizer_model:
            raise ConfigError("--sft --data-path needs --tokenizer-model DIR (a tokenizer.json, with "
                              "tokenizer_config.json for --sft-tokenizer-prompt-format tokenizer)")
        tokenizer = load_tokenizer(args.tokenizer_model)
        if tokenizer.vocab_size > args.vocab_size:
            raise ConfigError(f"the tokenizer {tokenizer.source} has {tokenizer.vocab_size} tokens, more than the "
                              f"model's --vocab-size {args.vocab_size}")
        template = ChatTemplate(tokenizer, args.sft_tokenizer_prompt_format)
        cache = args.data_cache_path or os.path.join(os.path.dirname(os.path.abspath(args.data_path[0])), "cache")
        data = prepare_data(args.data_path, tokenizer, Sft.of(args), cache, progress)
        held_out = read_conversations(held_out_file) if held_out_file else None
    except (TokenizerError, TemplateError, SFTDataError) as e:
        raise ConfigError(str(e)) from None
    if len(data.plan) < args.global_batch_size:
        raise ConfigError(f"--sft: the data packs into {len(data.plan)} sequences of --seq-length {args.seq_length}, "
                          f"fewer than one --global-batch-size {args.global_batch_size}")
    packed, padded = data.efficiency(args.seq_length)
    before, after = data.targets
    if progress and (data.num_unanswered or after < (1 - WARN_TARGETS_LOST) * before):
        print(f"mtmegatron: warning: {cut_warning(data, args.seq_length)}", flush=True)
    dropped = f", {data.num_dropped} dropped without an answer" if data.num_dropped else ""
    summary = (f"sft data {' '.join(args.data_path)} | {len(data)} conversations ({data.num_truncated} cut to "
               f"--seq-length{dropped}; assistant tokens kept {after / before:.1%}) -> {len(data.plan)} packed "
               f"sequences | non-pad tokens: {packed:.1%} packed, "
               f"{padded:.1%} padded | {'packed THD' if args.sft_packing else 'padded rows'} | template "
               f"{args.sft_tokenizer_prompt_format} | tokenizer {tokenizer.source}")
    return SFTInputs(tokenizer, template, data, held_out, summary, args.micro_batch_size * data.most_per_bin())


def cut_warning(data: SFTData, seq_length: int) -> str:
    before, after = data.targets
    kept = data.num_unanswered - data.num_dropped  # without an answer, still trained on (on nothing)
    text = f"--seq-length {seq_length} cuts {1 - after / before:.1%} of the assistant tokens"
    if kept:
        text += f"; {kept} of {len(data)} conversations lose their whole answer and train on nothing"
    if data.num_dropped:
        text += f"; {data.num_dropped} conversations without an answer left out (--sft-drop-unanswered)"
    return text + f": raise --seq-length{' or drop them with --sft-drop-unanswered' if kept else ''}"
