"""SFT data: JSONL files -> validated, tokenized conversations and their packing plan, cached; then each
data-parallel rank's micro-batches.

``prepare`` reads every record of every ``--data-path`` file up front and stops at the first bad one with one
message naming the file and the (1-based) line. The tokenized conversations, their assistant masks and the
packing plan are cached under ``<cache>/sft-<key>`` where the key hashes the files' contents, the tokenizer,
the template, ``--seq-length``, the seed and the padding multiple of context parallelism (``2 x CP``, 1 without
CP; see packing.py): a second run (or another rank) loads them.
Conversations longer than ``--seq-length`` positions are cut on the right and counted, with the assistant
(loss) tokens before and after the cut; data that the cut leaves without any assistant token is refused, and
``--sft-drop-unanswered`` leaves out the conversations it leaves without one. A file that is missing, a
directory, compressed or not UTF-8 is one ``SFTDataError``, and a failed preparation leaves no cache behind.
The SFT flags come as sft/section.py's ``Sft``; the padded layout's rows as a number (sft/prepare.py's).
May assume: called on every rank before any process group (a file lock lets one rank build the cache).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import sys
from dataclasses import dataclass
from typing import Iterator

import numpy as np

from mtmegatron.sft.formats import RecordError, parse_line
from mtmegatron.sft.section import Sft
from mtmegatron.sft.packing import Plan, first_fit_decreasing, packed_batch, padded_batch, round_up

CACHE_VERSION = 2


class SFTDataError(ValueError):
    """Unusable SFT data; the message names the file and record."""


# the first bytes of compressed files people hand over as "JSONL"
_COMPRESSED = {b"\x1f\x8b": "gzip", b"\xfd7zXZ": "xz", b"BZh": "bzip2", b"\x28\xb5\x2f\xfd": "zstd"}


def check_file(path: str) -> None:
    """``path`` is a readable, uncompressed file (what --sft reads), else an ``SFTDataError`` saying what it is."""
    if os.path.isdir(path):
        raise SFTDataError(f"--data-path {path} is a directory: --sft reads JSONL files (name each file)")
    if not os.path.isfile(path):
        raise SFTDataError(f"--data-path {path}: no such file (--sft reads JSONL files)")
    try:
        with open(path, "rb") as f:
            head = f.read(6)
    except OSError as e:
        raise SFTDataError(f"--data-path {path}: cannot be read ({e.strerror})") from None
    for magic, kind in _COMPRESSED.items():
        if head.startswith(magic):
            raise SFTDataError(f"--data-path {path} is {kind}-compressed: decompress it first (--sft reads plain "
                               f"UTF-8 JSONL)")


def read_conversations(path: str) -> list[list[dict]]:
    """Every record of a JSONL file as messages; the first bad record is an ``SFTDataError``."""
    check_file(path)
    conversations = []
    with open(path, "rb") as f:
        for number, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8-sig" if number == 1 else "utf-8")
            except UnicodeDecodeError as e:
                raise SFTDataError(f"{path}: record {number}: not UTF-8 text (byte {raw[e.start]:#04x} at offset "
                                   f"{e.start}): --sft reads UTF-8 JSONL") from None
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
    targets: tuple[int, int]  # assistant (loss) tokens of all conversations: before and after the cut
    num_unanswered: int  # conversations the cut left without any assistant token
    num_dropped: int  # of those, dropped by --sft-drop-unanswered

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


@dataclass
class CutStats:
    """What cutting conversations to ``--seq-length`` cost: counts of conversations and of assistant tokens."""
    truncated: int = 0
    targets_before: int = 0
    targets_after: int = 0
    unanswered: int = 0  # cut before their first assistant token
    dropped: int = 0
    shortest_answer_start: int | None = None  # fewest positions any conversation needs for one assistant token


def tokenize(conversations, template, seq_length: int, eod: int, progress: bool, drop_unanswered: bool = False):
    """(ids, assistant, offsets, CutStats): each conversation rendered, EOD appended (trained when the
    conversation ends with an assistant turn), cut to ``seq_length + 1`` tokens; with ``drop_unanswered`` a
    conversation the cut leaves without an assistant token is left out. Position ``i``'s label is token
    ``i + 1``, so the loss tokens are ``mask[1:]``."""
    from tqdm import tqdm

    ids, assistant, offsets, stats = [], [], [0], CutStats()
    for messages in tqdm(conversations, desc="mtmegatron: tokenizing conversations", unit="conv", mininterval=1.0,
                         disable=not (progress and sys.stderr.isatty())):  # a bar only on a terminal
        tokens, mask = template.encode(messages)
        tokens, mask = tokens + [eod], mask + [messages[-1]["role"] == "assistant"]
        before = sum(mask[1:])
        first = next((i for i, m in enumerate(mask) if m and i > 0), None)
        if first is not None and (stats.shortest_answer_start is None or first < stats.shortest_answer_start):
            stats.shortest_answer_start = first
        if len(tokens) > seq_length + 1:
            tokens, mask = tokens[: seq_length + 1], mask[: seq_length + 1]
            stats.truncated += 1
        after = sum(mask[1:])
        stats.targets_before += before
        stats.targets_after += after
        if after == 0:
            stats.unanswered += 1
            if drop_unanswered:
                stats.dropped += 1
                continue
        ids.extend(tokens)
        assistant.extend(mask)
        offsets.append(len(ids))
    return np.array(ids, np.int32), np.array(assistant, np.bool_), np.array(offsets, np.int64), stats


def check_cut(stats: CutStats, num_conversations: int, seq_length: int) -> None:
    """Refuse data that the cut leaves nothing to learn from (an ``SFTDataError``)."""
    if stats.targets_after == 0 or stats.dropped == num_conversations:
        need = (f" (the earliest answer starts after {stats.shortest_answer_start} positions)"
                if stats.shortest_answer_start else "")
        raise SFTDataError(f"{stats.unanswered} of {num_conversations} conversations lose their answer to "
                           f"--seq-length {seq_length}: nothing to train on; raise --seq-length{need}")


def padding_multiple(sft: Sft) -> int:
    """Each conversation's length is rounded up to this in the plan and the packed rows (2 x CP under CP)."""
    return 2 * sft.context_parallel_size if sft.context_parallel_size > 1 else 1


def _cache_key(files: list[str], tokenizer, sft: Sft) -> str:
    h = hashlib.sha256()
    for path in files:
        with open(path, "rb") as f:
            h.update(hashlib.sha256(f.read()).digest())
    h.update(json.dumps([CACHE_VERSION, tokenizer.unique_identifiers, sft.sft_tokenizer_prompt_format,
                         sft.seq_length, sft.seed] + ([padding_multiple(sft)] if padding_multiple(sft) > 1
                                                        else [])
                        + (["drop-unanswered"] if sft.sft_drop_unanswered else [])).encode())
    return h.hexdigest()[:16]


def _build(files: list[str], tokenizer, sft: Sft, directory: str, cached: str, progress: bool):
    from mtmegatron.sft.templates import ChatTemplate

    conversations = [c for path in files for c in read_conversations(path)]
    template = ChatTemplate(tokenizer, sft.sft_tokenizer_prompt_format)
    ids, assistant, offsets, stats = tokenize(conversations, template, sft.seq_length, tokenizer.eod, progress,
                                              sft.sft_drop_unanswered)
    check_cut(stats, len(conversations), sft.seq_length)
    lengths = round_up(np.diff(offsets) - 1, padding_multiple(sft))
    bins = first_fit_decreasing(lengths, sft.seq_length, sft.seed)
    bin_of = np.concatenate([np.full(len(b), i) for i, b in enumerate(bins)])
    order = np.concatenate([np.array(b) for b in bins])
    tmp = os.path.join(directory, f"data.tmp{os.getpid()}.npz")
    np.savez(tmp, ids=ids, assistant=assistant, offsets=offsets, truncated=stats.truncated,
             targets=np.array([stats.targets_before, stats.targets_after]), unanswered=stats.unanswered,
             dropped=stats.dropped, order=order, bin_of=bin_of)
    os.replace(tmp, cached)


def prepare(files: list[str], tokenizer, sft: Sft, cache_dir: str, progress: bool) -> SFTData:
    """Validated, tokenized, planned SFT data (built once, then read from the cache). Data that cannot be used
    leaves no cache directory behind."""
    for path in files:
        check_file(path)
    directory = os.path.join(cache_dir, f"sft-{_cache_key(files, tokenizer, sft)}")
    new_cache_dir = not os.path.isdir(cache_dir)
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as e:
        raise SFTDataError(f"the SFT cache {directory} cannot be created ({e.strerror}): give a writable "
                           f"--data-cache-path") from None
    cached = os.path.join(directory, "data.npz")
    try:
        with open(os.path.join(directory, ".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                if not os.path.exists(cached):
                    _build(files, tokenizer, sft, directory, cached, progress)
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)
    except BaseException:
        if not os.path.exists(cached):  # nothing usable was written: leave the data's directory as it was
            shutil.rmtree(directory, ignore_errors=True)
            if new_cache_dir:
                try:
                    os.rmdir(cache_dir)
                except OSError:  # no longer empty: another run's cache
                    pass
        raise
    with np.load(cached) as z:
        bins: list[list[int]] = [[] for _ in range(int(z["bin_of"].max()) + 1)]
        for index, b in zip(z["order"].tolist(), z["bin_of"].tolist()):
            bins[b].append(index)
        return SFTData(z["ids"], z["assistant"], z["offsets"], Plan(bins, sft.seed), int(z["truncated"]),
                       tuple(int(t) for t in z["targets"]), int(z["unanswered"]), int(z["dropped"]))


def micro_batches(data: SFTData, sft: Sft, dp_rank: int, plan, pad_id: int, padded_rows: int) -> Iterator[dict]:
    """This DP rank's micro-batches of the global batches of ``plan`` (training/data.py's SamplePlan: sample
    positions from the consumed-sample count), each position a bin of the packing plan; ``padded_rows``: the
    padded layout's rows per micro-batch."""
    from mtmegatron.data.position import rank_micro_batches

    for _, positions in rank_micro_batches(plan, dp_rank):
        bins = [[data.sample(i) for i in data.plan.bin(position)] for position in positions]
        if sft.sft_packing:
            yield packed_batch(bins, sft.seq_length, pad_id, padding_multiple(sft))
        else:
            yield padded_batch(bins, sft.seq_length, pad_id, padded_rows)
