"""Native-resolution vision conversations (JSONL) -> training samples for a vision-language model with M-RoPE, and
the two ways to batch them: padded (``collate_padded``) or packed into one THD sequence (``pack``).

A sample (``VisionConversationDataset[i]``)::

    tokens [n] int64, labels [n] int64 (labels[i]: the token after tokens[i] when it is trained, else -100),
    loss_mask [n] float32 (1 exactly where labels != -100), position_ids [3, n] int64 (mrope_positions.py),
    pixel_values [image patches, 3*2*14*14] float32, image_grid_thw [images, 3] int64,
    pixel_values_videos [video patches, 3*2*14*14] float32, video_grid_thw [videos, 3] int64,
    second_per_grid_ts [videos] float32 (temporal patch / fps)

``n`` is the sample's own length (no padding); a sample longer than ``seq_length`` is refused, never cut (a cut
could split a vision span). Every record is checked when the dataset is built (parsed, every image and video frame
opened and decoded, its grid computed from its size, rendered, length checked; resizing and patching wait for
``__getitem__``); the first bad one stops it with one ``BadSample`` naming file, line
and id (``load_vision_conversations`` turns it into a ``ConfigError``: one line, exit status 2), or with
``skip_bad_samples`` bad ones are left out and listed in ``bad_samples``.
May assume: the tokenizer has the vision chat template's special tokens (checked up front).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import torch

from mtmegatron.data.vision.dynamic_resolution import (IMAGE_PIXELS, VIDEO_PIXELS, PatchConfig,
                                                           check_frame_sizes, image_patches, load_image,
                                                           load_video, video_patches)
from mtmegatron.data.vision.mrope_positions import rope_index, token_types
from mtmegatron.data.vision.records import BadSample
from mtmegatron.data.vision.template import IGNORE_INDEX, TemplateError
from mtmegatron.data.vision.qwen_vl_chat import IMAGE_PAD, VIDEO_PAD, render_vision_chat, special_ids
from mtmegatron.data.vision.qwen_vl_records import VisionRecord, parse_vision_line
from mtmegatron.utils.errors import ConfigError


@dataclass(frozen=True)
class VisionDataConfig:
    seq_length: int
    image: PatchConfig = IMAGE_PIXELS
    video: PatchConfig = VIDEO_PIXELS
    default_fps: float = 2.0  # frames per second of a video's frames when the record does not say
    tokens_per_second: int | None = None  # None: the first generation's video positions (time step 1)
    skip_bad_samples: bool = False


class VisionConversationDataset(torch.utils.data.Dataset):
    """The samples of JSONL conversation files whose media paths are relative to ``media_folder``."""

    def __init__(self, paths: list[str], media_folder: str | None, tokenizer, config: VisionDataConfig):
        self.ids = special_ids(tokenizer)
        self.paths = [os.path.abspath(p) for p in paths]
        for path in self.paths:
            if not os.path.isfile(path):
                raise FileNotFoundError(f"no such conversation file: {path}")
        self.media_folder = os.path.abspath(media_folder or os.path.dirname(self.paths[0]))
        self.tokenizer, self.config = tokenizer, config
        self.entries, self.bad_samples = [], []  # entries: (file index, byte offset, line)
        self.loads = []  # per entry: text tokens + vision patches (data/vision/micro_batch_balance.py)
        self.lengths = []  # per entry: tokens (text and vision), what packing fits into --seq-length
        for file_index, path in enumerate(self.paths):
            with open(path, "rb") as f:
                offset = 0
                for number, raw in enumerate(f, 1):
                    if raw.strip():
                        try:
                            sample = self._build(raw.decode("utf-8"), path, number, with_pixels=False)
                            self.entries.append((file_index, offset, number))
                            self.loads.append(sample_load(sample))
                            self.lengths.append(int(sample["tokens"].numel()))
                        except BadSample as e:
                            if not config.skip_bad_samples:
                                raise
                            self.bad_samples.append(str(e))
                    offset += len(raw)
        if not self.entries:
            raise ValueError(f"no usable samples in {', '.join(self.paths)} ({len(self.bad_samples)} bad)")

    def __len__(self) -> int:
        return len(self.entries)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        file_index, offset, number = self.entries[i]
        path = self.paths[file_index]
        with open(path, "rb") as f:
            f.seek(offset)
            line = f.readline().decode("utf-8")
        return self._build(line, path, number)

    def _build(self, line: str, path: str, number: int, with_pixels: bool = True) -> dict[str, torch.Tensor]:
        record = parse_vision_line(line, path, number, self.media_folder, self.config.default_fps)

        def bad(reason: str) -> BadSample:
            return BadSample(path, number, record.sample_id, reason)

        images, videos = _load_media(record, bad)
        return build_sample(record, images, videos, self.tokenizer, self.config, bad, with_pixels)


def sample_load(sample: dict) -> int:
    """Text tokens plus vision patches of a sample (with or without its pixels)."""
    patches = sum(int(grid.prod(-1).sum()) for grid in (sample["image_grid_thw"], sample["video_grid_thw"]))
    return int(sample["tokens"].numel()) + patches


def _load_media(record: VisionRecord, bad):
    images, videos = [], []
    for image in record.images:
        if not os.path.isfile(image):
            raise bad(f"image file not found: {image}")
        try:
            images.append(load_image(image))
        except Exception as e:  # PIL raises OSError, ValueError, SyntaxError, DecompressionBombError...
            raise bad(f"cannot read image {image}: {e}") from None
    for k, video in enumerate(record.videos):
        name = video if isinstance(video, str) else f"video {k + 1} ({video[0]}, ...)"
        if isinstance(video, str) and not os.path.exists(video):
            raise bad(f"video file or frame folder not found: {video}")
        for frame in video if isinstance(video, list) else []:
            if not os.path.isfile(frame):
                raise bad(f"video frame not found: {frame}")
        try:
            frames = load_video(video)
        except Exception as e:
            raise bad(f"cannot read video {name}: {e}") from None
        if not frames:
            raise bad(f"video {name} has no frames")
        videos.append(frames)
    return images, videos


def build_sample(record: VisionRecord, images, videos, tokenizer, config: VisionDataConfig, bad,
                 with_pixels: bool = True) -> dict[str, torch.Tensor]:
    """The sample of a parsed record whose images (PIL) and videos (lists of PIL frames) are loaded; without
    pixels (validation) the grids come from the sizes alone and the pixel tensors are left out."""
    patch_dim = 3 * config.image.temporal_patch_size * config.image.patch_size ** 2
    try:
        if with_pixels:
            image_parts = [image_patches(image, config.image) for image in images]
            video_parts = [video_patches(frames, config.video) for frames in videos]
            image_grids = [grid for _, grid in image_parts]
            video_grids = [grid for _, grid in video_parts]
        else:
            image_grids = [config.image.grid(image.height, image.width) for image in images]
            video_grids = []
            for frames in videos:
                check_frame_sizes(frames)
                video_grids.append(config.video.grid(frames[0].height, frames[0].width, len(frames)))
    except ValueError as e:  # aspect ratio over 200, frames of different sizes
        raise bad(str(e)) from None
    ids, trained = render_vision_chat(record.turns, tokenizer, [config.image.num_tokens(g) for g in image_grids],
                                      [config.video.num_tokens(g) for g in video_grids])
    if len(ids) > config.seq_length:
        raise bad(f"{len(ids)} tokens (text and vision), over the sequence length {config.seq_length}")
    labels = np.full(len(ids), IGNORE_INDEX, dtype=np.int64)
    labels[:-1] = np.where(trained[1:], ids[1:], IGNORE_INDEX)
    if not (labels != IGNORE_INDEX).any():
        raise bad("no assistant answer token")
    special = special_ids(tokenizer)
    tokens = torch.from_numpy(ids)
    types = token_types(tokens[None], special[IMAGE_PAD], special[VIDEO_PAD])
    image_grid_thw = torch.tensor(image_grids, dtype=torch.long).reshape(-1, 3)
    video_grid_thw = torch.tensor(video_grids, dtype=torch.long).reshape(-1, 3)
    seconds = torch.tensor([config.video.temporal_patch_size / fps for fps in record.fps], dtype=torch.float32)
    position_ids, _ = rope_index(types, image_grid_thw, video_grid_thw, merge_size=config.image.merge_size,
                                 tokens_per_second=config.tokens_per_second, second_per_grid_ts=seconds)
    sample = {
        "tokens": tokens,
        "labels": torch.from_numpy(labels),
        "loss_mask": torch.from_numpy((labels != IGNORE_INDEX).astype(np.float32)),
        "position_ids": position_ids[:, 0],
        "image_grid_thw": image_grid_thw,
        "video_grid_thw": video_grid_thw,
        "second_per_grid_ts": seconds,
    }
    if with_pixels:
        sample["pixel_values"] = torch.cat([p for p, _ in image_parts]) if image_parts else torch.zeros(0, patch_dim)
        sample["pixel_values_videos"] = (torch.cat([p for p, _ in video_parts]) if video_parts
                                         else torch.zeros(0, patch_dim))
    return sample


VISION_KEYS = ("pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw", "second_per_grid_ts")


def collate_padded(samples: list[dict], pad_id: int, length: int | None = None) -> dict[str, torch.Tensor]:
    """[b, s] batch right-padded to the longest sample (or ``length``): padding has token ``pad_id``, label -100,
    loss mask 0, attention_mask 0 and position 0 (as HF gives padding); vision tensors are concatenated."""
    length = length or max(len(s["tokens"]) for s in samples)
    batch = len(samples)
    out = {"tokens": torch.full((batch, length), pad_id, dtype=torch.long),
           "labels": torch.full((batch, length), IGNORE_INDEX, dtype=torch.long),
           "loss_mask": torch.zeros(batch, length), "attention_mask": torch.zeros(batch, length, dtype=torch.long),
           "position_ids": torch.zeros(3, batch, length, dtype=torch.long)}
    for b, sample in enumerate(samples):
        n = len(sample["tokens"])
        for key in ("tokens", "labels", "loss_mask"):
            out[key][b, :n] = sample[key]
        out["attention_mask"][b, :n] = 1
        out["position_ids"][:, b, :n] = sample["position_ids"]
    out.update({key: torch.cat([s[key] for s in samples]) for key in VISION_KEYS})
    return out


def pack(samples: list[dict]) -> dict[str, torch.Tensor]:
    """Samples packed into one THD sequence [1, total]: tokens/labels/loss_mask concatenated, each sample's own 3-D
    positions kept (they restart at 0 per sample, as HF computes them per sample), ``cu_seqlens`` [k+1] int32 at
    the sample boundaries, vision tensors concatenated in order. A sample's last label is -100, so no target
    crosses into the next sample."""
    lengths = torch.tensor([len(s["tokens"]) for s in samples])
    out = {key: torch.cat([s[key] for s in samples])[None] for key in ("tokens", "labels", "loss_mask")}
    out["position_ids"] = torch.cat([s["position_ids"] for s in samples], dim=1)[:, None]
    out["cu_seqlens"] = torch.cat([torch.zeros(1, dtype=torch.int32), lengths.cumsum(0).to(torch.int32)])
    out.update({key: torch.cat([s[key] for s in samples]) for key in VISION_KEYS})
    return out


def load_vision_conversations(paths: list[str], media_folder: str | None, tokenizer,
                              config: VisionDataConfig) -> VisionConversationDataset:
    """``VisionConversationDataset``, with every user mistake (bad record, missing file, tokenizer without the
    template's tokens) as one ``ConfigError`` line (the entry points exit with status 2)."""
    try:
        return VisionConversationDataset(paths, media_folder, tokenizer, config)
    except (BadSample, TemplateError, FileNotFoundError, ValueError) as e:
        if isinstance(e, ConfigError):
            raise
        raise ConfigError(str(e)) from None
