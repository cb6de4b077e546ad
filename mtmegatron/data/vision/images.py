"""Image preprocessing for the vision encoder: load (PIL), RGB, resize to ``img_h x img_w`` (bicubic), scale to
[0, 1] and normalize with the encoder's mean/std; with tiling, cut the image into a grid of up to
``max_num_tiles`` tiles whose aspect ratio is closest to the image's (InternVL-style dynamic tiling, as in
Megatron-LM's multimodal example), plus a thumbnail of the whole image when ``use_thumbnail`` and the grid has
more than one tile.

The number of tiles depends only on the image's size (``ImageConfig.num_tiles``), so the loader can size every
sample's image span from the file header during validation.
May assume: Pillow and numpy; tensors are float32 [tiles, 3, img_h, img_w].
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image

# per vision-model-type normalization statistics (RGB)
NORMALIZATION = {
    "clip": ((0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711)),
    "siglip": ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5)),
    "internvit": ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),  # ImageNet
}


def candidate_grids(max_num_tiles: int) -> list[tuple[int, int]]:
    """(cols, rows) grids of 1..max_num_tiles tiles, fewest tiles first (ties: fewer columns first)."""
    grids = [(c, r) for c in range(1, max_num_tiles + 1) for r in range(1, max_num_tiles + 1)
             if c * r <= max_num_tiles]
    return sorted(grids, key=lambda g: (g[0] * g[1], g[0]))


def choose_grid(width: int, height: int, tile_w: int, tile_h: int, max_num_tiles: int) -> tuple[int, int]:
    """The (cols, rows) grid whose shape (cols*tile_w : rows*tile_h) is closest to the image's aspect ratio.

    Several grids can share the best ratio (1x1, 2x2, 3x3 for a square image): the larger one wins only while
    the image has at least half the pixels that grid would cover, so small images are not blown up.
    """
    aspect = width / height
    best, best_diff = (1, 1), float("inf")
    for cols, rows in candidate_grids(max_num_tiles):
        diff = abs(aspect - (cols * tile_w) / (rows * tile_h))
        if diff < best_diff:
            best, best_diff = (cols, rows), diff
        elif diff == best_diff and width * height > 0.5 * cols * rows * tile_w * tile_h:
            best = (cols, rows)
    return best


@dataclass(frozen=True)
class ImageConfig:
    img_h: int
    img_w: int
    mean: tuple[float, float, float] = NORMALIZATION["clip"][0]
    std: tuple[float, float, float] = NORMALIZATION["clip"][1]
    use_tiling: bool = False
    max_num_tiles: int = 1
    use_thumbnail: bool = False

    @classmethod
    def for_vision_model(cls, vision_model_type: str, img_h: int, img_w: int, **tiling) -> "ImageConfig":
        if vision_model_type not in NORMALIZATION:
            raise ValueError(f"no image normalization known for --vision-model-type {vision_model_type} "
                             f"(known: {', '.join(NORMALIZATION)})")
        mean, std = NORMALIZATION[vision_model_type]
        return cls(img_h, img_w, mean, std, **tiling)

    def grid(self, width: int, height: int) -> tuple[int, int]:
        if not self.use_tiling:
            return 1, 1
        return choose_grid(width, height, self.img_w, self.img_h, self.max_num_tiles)

    def num_tiles(self, width: int, height: int) -> int:
        """Tiles an image of this size becomes (thumbnail included)."""
        cols, rows = self.grid(width, height)
        return cols * rows + (1 if self.use_thumbnail and cols * rows > 1 else 0)

    def normalize(self, image: Image.Image) -> np.ndarray:
        """An ``img_w x img_h`` RGB PIL image -> float32 [3, img_h, img_w]."""
        pixels = np.asarray(image, dtype=np.float32) / 255.0
        pixels = (pixels - np.asarray(self.mean, dtype=np.float32)) / np.asarray(self.std, dtype=np.float32)
        return pixels.transpose(2, 0, 1)

    def tiles(self, image: Image.Image) -> torch.Tensor:
        """A PIL image -> normalized tiles [num_tiles, 3, img_h, img_w] (grid row by row, thumbnail last)."""
        image = image.convert("RGB")
        cols, rows = self.grid(*image.size)
        resized = image.resize((cols * self.img_w, rows * self.img_h), Image.BICUBIC)
        out = []
        for r in range(rows):
            for c in range(cols):
                box = (c * self.img_w, r * self.img_h, (c + 1) * self.img_w, (r + 1) * self.img_h)
                out.append(self.normalize(resized.crop(box)))
        if self.use_thumbnail and cols * rows > 1:
            out.append(self.normalize(image.resize((self.img_w, self.img_h), Image.BICUBIC)))
        return torch.from_numpy(np.stack(out))

    def load(self, path: str) -> torch.Tensor:
        with Image.open(path) as image:
            return self.tiles(image)


def image_size(path: str, decode: bool = True) -> tuple[int, int]:
    """(width, height) of an image file; ``decode`` reads every pixel, so a truncated or corrupt file fails here
    and not mid-epoch. Raises OSError/ValueError (PIL's) for files that are not readable images."""
    with Image.open(path) as image:
        if decode:
            image.load()
        return image.size
