"""Dynamic-resolution vision inputs: an image, or a video's frames, at (close to) its own size -> flattened patches
and its patch grid, the layout a native-resolution vision encoder (patch 14, temporal patch 2, 2x2 patch merger)
takes.

The rule, the same as HF transformers' dynamic-resolution image processor for these encoders (tested equal):
- size: each side rounded to a multiple of ``factor = patch_size * merge_size`` (28); when that leaves more than
  ``max_pixels`` (or fewer than ``min_pixels``) pixels, both sides are scaled by the same factor first, rounded
  down (up), so the aspect ratio is kept within one factor; an aspect ratio over 200 is refused;
- pixels: RGB (transparency composited onto white), PIL bicubic resize of the uint8 image, x/255 (in float64, then
  float32), normalized with the encoder's mean/std in float32;
- patches: ``pixel_values [grid_t * grid_h * grid_w, C * temporal_patch * patch * patch]``, one row per 14x14
  patch, ordered frame group by frame group, then 2x2 merge window by merge window (row-major), then the four
  patches of a window (row-major), so the merger takes ``merge_size**2`` consecutive rows; a row holds channels,
  then the temporal patch, then the 14x14 pixels. A still image is one frame repeated ``temporal_patch_size``
  times (``grid_t = 1``); a video with a frame count not divisible by the temporal patch repeats its last frame.
Videos use their own pixel budget (``VIDEO_PIXELS``, HF's video processor defaults); HF resizes video frames with
torchvision, we with PIL (as for images), so video pixels may differ from HF's by interpolation, not by layout.
May assume: Pillow, numpy and torch; frames of one video all have the same size (checked).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image

from mtmegatron.data.vision.images import NORMALIZATION

MAX_ASPECT_RATIO = 200
FRAME_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".webp", ".gif", ".tif", ".tiff")


@dataclass(frozen=True)
class PatchConfig:
    """How images become patches; defaults are the released encoders' (min 56x56, max 1280 merged tokens)."""

    patch_size: int = 14
    temporal_patch_size: int = 2
    merge_size: int = 2
    min_pixels: int = 56 * 56
    max_pixels: int = 28 * 28 * 1280
    mean: tuple[float, float, float] = NORMALIZATION["clip"][0]
    std: tuple[float, float, float] = NORMALIZATION["clip"][1]

    @property
    def factor(self) -> int:
        return self.patch_size * self.merge_size

    def resized_size(self, height: int, width: int) -> tuple[int, int]:
        return smart_resize(height, width, self.factor, self.min_pixels, self.max_pixels)

    def grid(self, height: int, width: int, num_frames: int = 1) -> tuple[int, int, int]:
        """(grid_t, grid_h, grid_w) in patches of an image/video of this size, without reading its pixels."""
        resized_h, resized_w = self.resized_size(height, width)
        grid_t = -(-num_frames // self.temporal_patch_size)
        return grid_t, resized_h // self.patch_size, resized_w // self.patch_size

    def num_tokens(self, grid_thw) -> int:
        """Language-model positions (merged tokens) of one image/video of patch grid ``grid_thw``."""
        t, h, w = (int(x) for x in grid_thw)
        return t * h * w // self.merge_size ** 2


IMAGE_PIXELS = PatchConfig()
VIDEO_PIXELS = PatchConfig(min_pixels=128 * 28 * 28, max_pixels=28 * 28 * 768)


def smart_resize(height: int, width: int, factor: int = 28, min_pixels: int = 56 * 56,
                 max_pixels: int = 28 * 28 * 1280) -> tuple[int, int]:
    """(height, width), multiples of ``factor``, with about the same aspect ratio and min..max pixels."""
    if max(height, width) / min(height, width) > MAX_ASPECT_RATIO:
        raise ValueError(f"aspect ratio {max(height, width) / min(height, width):.1f} is over "
                         f"{MAX_ASPECT_RATIO} ({width}x{height})")
    new_h, new_w = round(height / factor) * factor, round(width / factor) * factor
    if new_h * new_w > max_pixels:
        shrink = math.sqrt(height * width / max_pixels)
        new_h = max(factor, math.floor(height / shrink / factor) * factor)
        new_w = max(factor, math.floor(width / shrink / factor) * factor)
    elif new_h * new_w < min_pixels:
        grow = math.sqrt(min_pixels / (height * width))
        new_h = math.ceil(height * grow / factor) * factor
        new_w = math.ceil(width * grow / factor) * factor
    return new_h, new_w


def to_rgb(image: Image.Image) -> Image.Image:
    """RGB, with any transparency composited onto white."""
    if "A" in image.getbands() or image.info.get("transparency") is not None:
        rgba = image.convert("RGBA")
        return Image.alpha_composite(Image.new("RGBA", rgba.size, (255, 255, 255, 255)), rgba).convert("RGB")
    return image.convert("RGB")


def normalized_frame(image: Image.Image, height: int, width: int, config: PatchConfig) -> np.ndarray:
    """A PIL image -> float32 [3, height, width]: RGB, bicubic resize, x/255, (x - mean) / std."""
    rgb = to_rgb(image)
    if rgb.size != (width, height):
        rgb = rgb.resize((width, height), Image.BICUBIC)
    pixels = (np.asarray(rgb).astype(np.float64) * (1 / 255)).astype(np.float32)
    mean, std = np.asarray(config.mean, dtype=np.float32), np.asarray(config.std, dtype=np.float32)
    return ((pixels - mean) / std).transpose(2, 0, 1)


def patchify(frames: torch.Tensor, config: PatchConfig) -> tuple[torch.Tensor, tuple[int, int, int]]:
    """frames [F, C, H, W] (H, W multiples of the factor) -> (pixel_values [t*h*w, C*T*p*p], (t, h, w))."""
    if pad := -frames.shape[0] % config.temporal_patch_size:
        frames = torch.cat([frames, frames[-1:].expand(pad, -1, -1, -1)])
    num_frames, channels, height, width = frames.shape
    p, m, tp = config.patch_size, config.merge_size, config.temporal_patch_size
    grid_t, grid_h, grid_w = num_frames // tp, height // p, width // p
    patches = frames.reshape(grid_t, tp, channels, grid_h // m, m, p, grid_w // m, m, p)
    # -> (t, merge row, merge col, row in window, col in window, C, T, p, p)
    patches = patches.permute(0, 3, 6, 4, 7, 2, 1, 5, 8)
    return patches.reshape(grid_t * grid_h * grid_w, channels * tp * p * p), (grid_t, grid_h, grid_w)


def image_patches(image: Image.Image, config: PatchConfig = IMAGE_PIXELS) -> tuple[torch.Tensor, tuple]:
    """One PIL image -> (pixel_values [h*w, 3*T*p*p], (1, h, w))."""
    height, width = config.resized_size(image.height, image.width)
    frame = torch.from_numpy(normalized_frame(image, height, width, config))
    return patchify(frame[None], config)


def check_frame_sizes(frames: list[Image.Image]) -> bool:
    """True for a non-empty list of frames of one size; else ValueError saying what is wrong."""
    if not frames:
        raise ValueError("a video with no frames")
    sizes = {f.size for f in frames}
    if len(sizes) > 1:
        raise ValueError(f"video frames differ in size ({', '.join(f'{w}x{h}' for w, h in sorted(sizes))})")
    return True


def video_patches(frames: list[Image.Image], config: PatchConfig = VIDEO_PIXELS) -> tuple[torch.Tensor, tuple]:
    """A video's frames (PIL images of one size) -> (pixel_values [t*h*w, 3*T*p*p], (t, h, w))."""
    check_frame_sizes(frames)
    height, width = config.resized_size(frames[0].height, frames[0].width)
    stacked = np.stack([normalized_frame(f, height, width, config) for f in frames])
    return patchify(torch.from_numpy(stacked), config)


def load_image(path: str) -> Image.Image:
    """A fully decoded image (a truncated or corrupt file fails here: OSError/ValueError from PIL)."""
    with Image.open(path) as image:
        image.load()
        return image.copy()


def frame_files(video: str | list[str]) -> list[str] | None:
    """The frame files of a video given as a list of files or a folder of images (sorted by name); None for a
    video file (decoded with PyAV)."""
    if isinstance(video, list):
        return video
    if os.path.isdir(video):
        return sorted(os.path.join(video, f) for f in os.listdir(video) if f.lower().endswith(FRAME_SUFFIXES))
    return None


def load_video(video: str | list[str]) -> list[Image.Image]:
    """The frames of a video: a list of image files, a folder of them, or a video file (needs PyAV)."""
    files = frame_files(video)
    if files is not None:
        return [load_image(f) for f in files]
    if not os.path.isfile(video):
        raise FileNotFoundError(f"no such video file or frame folder: {video}")
    try:
        import av
    except ImportError:
        raise ValueError(f"reading the video file {video} needs PyAV (pip install av); or give its frames as a "
                         f"folder or list of image files") from None
    with av.open(video) as container:
        return [frame.to_image() for frame in container.decode(video=0)]
