"""SFT data: JSONL files -> validated, tokenized conversations and their packing plan, cached; then each
data-parallel rank's micro-batches.

``prepare`` reads every record of every ``--data-path`` file up front and stops at the first bad one with one
message naming the file and the (1-based) line. The tokenized conversations, their assistant masks and the
packing plan are cached under ``<cache>/sft-<key>`` where the key hashes the files' contents, the tokenizer,
the template, ``--seq-length``, the seed and the padding multiple of context parallelism (``2 x CP``, 1 without
CP; see packing.py): a second run (or another rank) loads them.
Conversations longer than ``--seq-length`` positions are cut on the right and counted.
May assume: called on every rank before any process group (a file lock lets one rank build the cache).
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
from dataclasses import dataclass
from typing import Iterator

import numpy as np

from mtmegatron.sft.formats import RecordError, parse_line
from mtmegatron.sft.packing import Plan, first_fit_decreasing, packed_batch, padded_batch, round_up

CACHE_VERSION = 1


class SFTDataError(ValueError):
    """Unusable SFT data; the message names the file and record."""


def read_conversations(path: str) -> list[list[dict]]:
    """Every record of a JSONL file as messages; the first bad record is an ``SFTDataError``."""
    if not os.path.isfile(path):
        raise SFTDataError(f"--data-path {path}: no such file (--sft reads JSONL files)")
    conversations = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                conversations.append(parse_line(line))
            except RecordError as e:
                raise SFTDataError(f"{path}: record {number}: {e}") from None
    if not conversations:
        raise SFTDataError(f"{path}: no records")
    return conversations


@dataclass
class SFTData:
    """Tokenized conversations (``ids``/``assistant`` concatenated, split at ``offsets``) and the plan."""
    ids: np.ndarray
    assistant: np.ndarray
    offsets: np.ndarray
    plan: Plan
    num_truncated: int

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def most_per_bin(self) -> int:
        return max(len(b) for b in self.plan.bins)

    def sample(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        start, end = self.offsets[i], self.offsets[i + 1]
        return self.ids[start:end], self.assistant[start:end]

    def efficiency(self, seq_length: int) -> tuple[float, float]:
        """Fraction of non-pad positions when packed, and when padded (one conversation per row)."""
        real = float(np.diff(self.offsets).sum() - len(self))
        return real / (len(self.plan) * seq_length), real / (len(self) * seq_length)


def tokenize(conversations, template, seq_length: int, eod: int, progress: bool):
    """(ids, assistant, offsets, number truncated): each conversation rendered, EOD appended (trained when the
    conversation ends with an assistant turn), cut to ``seq_length + 1`` tokens."""
    from tqdm import tqdm

    ids, assistant, offsets, truncated = [], [], [0], 0
    for messages in tqdm(conversations, desc="mtmegatron: tokenizing conversations", disable=not progress,
                         unit="conv", mininterval=1.0):
        tokens, mask = template.encode(messages)
        tokens, mask = tokens + [eod], mask + [messages[-1]["role"] == "assistant"]
        if len(tokens) > seq_length + 1:
            tokens, mask, truncated = tokens[: seq_length + 1], mask[: seq_length + 1], truncated + 1
        ids.extend(tokens)
        assistant.extend(mask)
        offsets.append(len(ids))
    return np.array(ids, np.int32), np.array(assistant, np.bool_), np.array(offsets, np.int64), truncated


def padding_multiple(args: argparse.Namespace) -> int:
    """Each conversation's length is rounded up to this in the plan and the packed rows (2 x CP under CP)."""
    return 2 * args.context_parallel_size if args.context_parallel_size > 1 else 1


def _cache_key(files: list[str], tokenizer, args: argparse.Namespace) -> str:
    h = hashlib.sha256()
    for path in files:
        with open(path, "rb") as f:
            h.update(hashlib.sha256(f.read()).digest())
    h.update(json.dumps([CACHE_VERSION, tokenizer.unique_identifiers, args.sft_tokenizer_prompt_format,
                         args.seq_length, args.seed] + ([padding_multiple(args)] if padding_multiple(args) > 1
                                                        else [])).encode())
    return h.hexdigest()[:16]


def prepare(files: list[str], tokenizer, args: argparse.Namespace, cache_dir: str, progress: bool) -> SFTData:
    """Validated, tokenized, planned SFT data (built once, then read from the cache)."""
    from mtmegatron.sft.templates import ChatTemplate

    directory = os.path.join(cache_dir, f"sft-{_cache_key(files, tokenizer, args)}")
    os.makedirs(directory, exist_ok=True)
    cached = os.path.join(directory, "data.npz")
    with open(os.path.join(directory, ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if not os.path.exists(cached):
                conversations = [c for path in files for c in read_conversations(path)]
                template = ChatTemplate(tokenizer, args.sft_tokenizer_prompt_format)
                ids, assistant, offsets, truncated = tokenize(conversations, template, args.seq_length,
                                                              tokenizer.eod, progress)
                lengths = round_up(np.diff(offsets) - 1, padding_multiple(args))
                bins = first_fit_decreasing(lengths, args.seq_length, args.seed)
                bin_of = np.concatenate([np.full(len(b), i) for i, b in enumerate(bins)])
                order = np.concatenate([np.array(b) for b in bins])
                tmp = os.path.join(directory, f"data.tmp{os.getpid()}.npz")
                np.savez(tmp, ids=ids, assistant=assistant, offsets=offsets, truncated=truncated,
                         order=order, bin_of=bin_of)
                os.replace(tmp, cached)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    with np.load(cached) as z:
        bins: list[list[int]] = [[] for _ in range(int(z["bin_of"].max()) + 1)]
        for index, b in zip(z["order"].tolist(), z["bin_of"].tolist()):
            bins[b].append(index)
        return SFTData(z["ids"], z["assistant"], z["offsets"], Plan(bins, args.seed), int(z["truncated"]))


def micro_batches(data: SFTData, args: argparse.Namespace, dp_rank: int, start_iteration: int,
                  pad_id: int) -> Iterator[dict]:
    """This DP rank's micro-batches for iterations ``start_iteration, start_iteration+1, ...``."""
    gbs, mbs, dp = args.global_batch_size, args.micro_batch_size, args.data_parallel_size
    per_rank = gbs // dp
    iteration = start_iteration
    while True:
        first = iteration * gbs + dp_rank * per_rank
        for offset in range(0, per_rank, mbs):
            bins = [[data.sample(i) for i in data.plan.bin(first + offset + k)] for k in range(mbs)]
            if args.sft_packing:
                yield packed_batch(bins, args.seq_length, pad_id, padding_multiple(args))
            else:
                yield padded_batch(bins, args.seq_length, pad_id, args.sft_padded_rows)
        iteration += 1
