"""The LLaVA/ShareGPT conversation dataset: JSONL files + an image folder -> fixed-size training samples.

Everything that can go wrong with a sample is found up front, in one validation pass with a progress bar:
the record is parsed and its roles checked (``records.py``), rendered with the template, every image is opened
and fully decoded (missing or corrupt files), its tile count computed, and the sample cut to
``decoder_seq_length`` (``data/vision/llava_sample.py``). The first bad sample stops the pass with one ``BadSample`` error naming
the file, line and id; with ``skip_bad_samples`` bad samples are left out and counted (``bad_samples``). The
result, an index of (file, byte offset or array index, line, tiles per image) per good sample, is cached as JSON under
``$MTMEGATRON_CACHE/multimodal-index/`` keyed on the files' size/mtime and every setting that changes it, and
built by one process at a time (file lock), so all ranks share it. ``__getitem__`` re-reads the line, renders
it and loads the images again: it cannot fail on data that passed validation (unless the files changed).
Files are JSONL (one record per line, read back by byte offset) or one JSON array of records (LLaVA's own
``.json`` layout, held in memory once per process).
May assume: POSIX file system (fcntl); plain (uncompressed) UTF-8.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import sys
from dataclasses import asdict, dataclass

import torch
from tqdm import tqdm

from mtmegatron.data.vision.images import ImageConfig, image_size
from mtmegatron.data.vision.records import BadSample, parse_line, parse_record
from mtmegatron.data.vision.llava_sample import SampleDoesNotFit, fit_sample
from mtmegatron.data.vision.template import check_template, render

INDEX_VERSION = 1  # bump when validation or the index layout changes


@dataclass(frozen=True)
class LoaderConfig:
    template: str
    img_seq_len: int  # image embeddings per tile (the model's img_seq_len)
    decoder_seq_length: int
    image: ImageConfig
    skip_bad_samples: bool = False


def pad_id(tokenizer) -> int:
    """Padding id: the tokenizer's pad token, else its end-of-document token (padding is never trained on)."""
    return tokenizer.pad if tokenizer.pad >= 0 else tokenizer.eod


class ConversationDataset(torch.utils.data.Dataset):
    """Samples: {tokens, labels, loss_mask [text_len], images [tiles, 3, H, W], num_image_tiles [images]}."""

    def __init__(self, paths: list[str], image_folder: str | None, tokenizer, config: LoaderConfig,
                 progress: bool = True, cache: bool = True):
        check_template(config.template, tokenizer)
        self.paths = [os.path.abspath(p) for p in paths]
        for path in self.paths:
            if not os.path.isfile(path):
                raise FileNotFoundError(f"no such conversation file: {path}")
        self.image_folder = os.path.abspath(image_folder or os.path.dirname(self.paths[0]))
        self.tokenizer, self.config = tokenizer, config
        self.pad_id = pad_id(tokenizer)
        self._arrays: dict[str, list] = {}
        self.is_array = [_is_json_array(p) for p in self.paths]
        index = self._load_or_build_index(progress, cache)
        self.entries = index["entries"]
        self.bad_samples = index["bad"]  # [path, line, id, reason] of each skipped sample
        if self.bad_samples and not config.skip_bad_samples:  # a cached index made with skipping
            path, line, sample_id, reason = self.bad_samples[0]
            raise BadSample(path, line, sample_id, reason + _skip_hint(len(self.bad_samples)))
        if not self.entries:
            raise ValueError(f"no usable samples in {', '.join(self.paths)} ({len(self.bad_samples)} bad)")

    # ---- validation pass ----------------------------------------------------------------------------------
    def _cache_key(self) -> str:
        files = [(p, os.path.getsize(p), os.stat(p).st_mtime_ns) for p in self.paths]
        key = {"version": INDEX_VERSION, "files": files, "image_folder": self.image_folder,
               "tokenizer": self.tokenizer.unique_identifiers,
               "config": {**asdict(self.config), "skip_bad_samples": None}}
        return hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:24]

    def _load_or_build_index(self, progress: bool, cache: bool) -> dict:
        if not cache:
            return self._build_index(progress)
        from mtmegatron.data.embedded import cache_root

        directory = os.path.join(cache_root(), "multimodal-index")
        os.makedirs(directory, exist_ok=True)
        file = os.path.join(directory, self._cache_key() + ".json")
        with open(os.path.join(directory, ".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                if os.path.exists(file):
                    with open(file) as f:
                        return json.load(f)
                index = self._build_index(progress)
                with open(file + ".tmp", "w") as f:
                    json.dump(index, f)
                os.replace(file + ".tmp", file)
                return index
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _build_index(self, progress: bool) -> dict:
        entries, bad = [], []
        total = sum(os.path.getsize(p) for p in self.paths)
        with tqdm(total=total, unit="B", unit_scale=True, desc="validating multimodal samples",
                  disable=not progress, file=sys.stderr) as bar:
            for file_index, path in enumerate(self.paths):
                for position, number, record in self._records(file_index, bar):
                    try:
                        tiles = self._validate(record, path, number)
                        entries.append([file_index, position, number, tiles])
                    except BadSample as e:
                        if not self.config.skip_bad_samples:
                            raise BadSample(e.path, e.line, e.sample_id, e.reason + _skip_hint(1)) from None
                        bad.append([e.path, e.line, e.sample_id, e.reason])
                        bar.set_postfix(bad=len(bad), refresh=False)
        return {"entries": entries, "bad": bad}

    def _records(self, file_index: int, bar):
        """(position, line number or "record N", raw line or decoded record) of each record of ``path``; the
        position is a byte offset (JSONL) or an index (JSON array)."""
        path = self.paths[file_index]
        if self.is_array[file_index]:
            records = self._array(path)
            bar.update(os.path.getsize(path))
            for k, record in enumerate(records):
                yield k, f"record {k + 1}", record
            return
        with open(path, "rb") as f:
            offset = 0
            for number, raw in enumerate(f, 1):
                bar.update(len(raw))
                if raw.strip():
                    yield offset, number, raw.decode("utf-8")
                offset += len(raw)

    def _array(self, path: str) -> list:
        """The records of a JSON array file (LLaVA's ``llava_v1_5_mix665k.json`` layout), loaded once."""
        if path not in self._arrays:
            with open(path, encoding="utf-8") as f:
                try:
                    records = json.load(f)
                except json.JSONDecodeError as e:
                    raise ValueError(f"{path}: not valid JSON ({e.msg} at line {e.lineno} column {e.colno}); "
                                     f"expected JSONL (one record per line) or one JSON array of records") from None
            if not isinstance(records, list):
                raise ValueError(f"{path}: a JSON file must hold an array of records")
            self._arrays[path] = records
        return self._arrays[path]

    def __getstate__(self):  # DataLoader workers reload JSON arrays themselves rather than receive a pickled copy
        return {**self.__dict__, "_arrays": {}}

    def _parse(self, record, path: str, number):
        if isinstance(record, str):
            return parse_line(record, path, number, self.image_folder)
        return parse_record(record, path, number, self.image_folder)

    def _validate(self, record, path: str, number) -> list[int]:
        sample_id, turns, image_paths = self._parse(record, path, number)
        tiles = []
        for image in image_paths:
            if not os.path.isfile(image):
                raise BadSample(path, number, sample_id, f"image file not found: {image}")
            try:
                width, height = image_size(image)
            except Exception as e:  # PIL raises OSError, ValueError, SyntaxError, DecompressionBombError...
                raise BadSample(path, number, sample_id, f"cannot read image {image}: {e}") from None
            tiles.append(self.config.image.num_tiles(width, height))
        ids, trained = render(self.config.template, turns, self.tokenizer)
        try:
            fit_sample(ids, trained, tiles, self.config.img_seq_len, self.config.decoder_seq_length, self.pad_id)
        except SampleDoesNotFit as e:
            raise BadSample(path, number, sample_id, str(e)) from None
        return tiles

    # ---- samples ------------------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.entries)

    def conversation(self, i: int):
        """(sample id, turns, image paths) of sample ``i``, read from its file as validated."""
        file_index, position, number, _ = self.entries[i]
        path = self.paths[file_index]
        if self.is_array[file_index]:
            record = self._array(path)[position]
        else:
            with open(path, "rb") as f:
                f.seek(position)
                record = f.readline().decode("utf-8")
        return self._parse(record, path, number)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        tiles = self.entries[i][3]
        _, turns, image_paths = self.conversation(i)
        ids, trained = render(self.config.template, turns, self.tokenizer)
        sample = fit_sample(ids, trained, tiles, self.config.img_seq_len, self.config.decoder_seq_length,
                            self.pad_id)
        cfg = self.config.image
        images = [cfg.load(p) for p in image_paths]
        sample["images"] = torch.cat(images) if images else torch.zeros((0, 3, cfg.img_h, cfg.img_w))
        sample["num_image_tiles"] = torch.tensor(tiles, dtype=torch.int32)
        return sample


def _is_json_array(path: str) -> bool:
    with open(path, "rb") as f:
        return f.read(4096).lstrip().startswith(b"[")


def _skip_hint(num_bad: int) -> str:
    more = f" ({num_bad - 1} more bad sample(s))" if num_bad > 1 else ""
    return f"{more}; --skip-bad-samples leaves bad samples out and counts them"
