"""Tiling picks the grid closest to the image's aspect ratio; tiles are cut row by row with the thumbnail last;
pixels are normalized with the vision model's mean/std."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from mtmegatron.data.vision.images import NORMALIZATION, ImageConfig, choose_grid


@pytest.mark.parametrize("size, max_tiles, grid", [
    ((64, 64), 4, (2, 2)),    # square and big enough for 2x2
    ((32, 32), 4, (1, 1)),    # square but small: not blown up to 2x2
    ((128, 32), 4, (4, 1)),   # 4:1 wide
    ((64, 32), 4, (2, 1)),    # 2:1 wide
    ((32, 96), 4, (1, 3)),    # 1:3 tall
    ((100, 60), 4, (2, 1)),   # 1.67: closest is 2:1
    ((1000, 1000), 6, (2, 2)),
    ((300, 100), 2, (2, 1)),  # 3:1 but at most 2 tiles
])
def test_choose_grid(size, max_tiles, grid):
    assert choose_grid(*size, 32, 32, max_tiles) == grid


def test_grid_with_non_square_tiles():
    # tiles 64 wide x 32 high: a 128x64 image is 2x2 such tiles; a 128x32 image is 2x1
    assert choose_grid(128, 64, 64, 32, 4) == (2, 2)
    assert choose_grid(128, 32, 64, 32, 4) == (2, 1)


def _quadrants() -> Image.Image:
    pixels = np.zeros((64, 64, 3), dtype=np.uint8)
    pixels[:32, :32], pixels[:32, 32:], pixels[32:, :32], pixels[32:, 32:] = 10, 80, 160, 240
    return Image.fromarray(pixels)


@pytest.mark.parametrize("vision", ["clip", "siglip"])
def test_tiles_row_major_thumbnail_last_and_normalized(vision):
    config = ImageConfig.for_vision_model(vision, 32, 32, use_tiling=True, max_num_tiles=4, use_thumbnail=True)
    tiles = config.tiles(_quadrants())
    assert tiles.shape == (5, 3, 32, 32) and tiles.dtype == torch.float32
    mean, std = (torch.tensor(v).view(3, 1, 1) for v in NORMALIZATION[vision])
    for k, value in enumerate((10, 80, 160, 240)):
        torch.testing.assert_close(tiles[k], ((value / 255 - mean) / std).expand(3, 32, 32))
    thumbnail = tiles[4] * std + mean  # un-normalized: the whole image at tile size, quadrants kept
    assert abs(float(thumbnail[0, 4, 4]) * 255 - 10) < 1 and abs(float(thumbnail[0, 28, 28]) * 255 - 240) < 1


def test_no_tiling_resizes_to_one_tile_and_converts_to_rgb():
    config = ImageConfig.for_vision_model("clip", 16, 24)
    gray = Image.fromarray(np.full((50, 70), 128, dtype=np.uint8))  # mode L
    tiles = config.tiles(gray)
    assert tiles.shape == (1, 3, 16, 24)
    mean, std = NORMALIZATION["clip"]
    for c in range(3):
        torch.testing.assert_close(tiles[0, c], torch.full((16, 24), (128 / 255 - mean[c]) / std[c]))
    assert config.num_tiles(1000, 10) == 1


def test_unknown_vision_model():
    with pytest.raises(ValueError, match="no image normalization known for --vision-model-type radio"):
        ImageConfig.for_vision_model("radio", 32, 32)
