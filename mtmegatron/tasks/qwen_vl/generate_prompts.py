"""What a prompt for a native-resolution vision-language model (models/families/qwen2_vl/model.py) carries besides
its tokens, and the two things generation does with it: the M-RoPE positions of every token it will hold, and the prompt's image
embeddings merged into the token embeddings.

``VisionPrompt``: the prompt's image patches and grids (``pixel_values`` ``[patches, C*T*P*P]``,
``image_grid_thw`` ``[images, 3]``; none for a text prompt) and the 3-D positions of its tokens (``positions``
``[3, n]``, data/vision/mrope_positions.py: HF's ``get_rope_index``).
Positions while decoding (``continued_positions``), as HF's Qwen2-VL generation: the token at sequence index
``i >= n`` gets ``i + rope_delta`` on all three axes, ``rope_delta = max(prompt positions) + 1 - n``; so the first
new token sits one past the prompt's largest position and each later one a step further.
Image embeddings: the vision tower runs once over the images of a whole batch of prompts (``vision_rows``); the
rows go to the prompt tokens that are image placeholders (``image_token_id``), batch-major in sequence order, as
the model's own ``embed`` (HF's ``masked_scatter``) places them. A generated token that happens to be the image
placeholder is an ordinary token (HF passes no pixels after the prompt either).
May assume: the model (inside any DDP / Float16Module wrappers) is a ``NativeResolutionVLM``; tensors of one call on
one device.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class VisionPrompt:
    positions: torch.Tensor  # [3, n] int64: the prompt's M-RoPE positions
    pixel_values: torch.Tensor | None = None  # [patches, C*T*P*P] of the prompt's images, in order
    image_grid_thw: torch.Tensor | None = None  # [images, 3]

    @property
    def has_images(self) -> bool:
        return self.pixel_values is not None and self.pixel_values.shape[0] > 0


def unwrap(model):
    """The NativeResolutionVLM inside DDP / Float16Module wrappers."""
    while hasattr(model, "module"):
        model = model.module
    return model


def continued_positions(prompt_positions: torch.Tensor, length: int) -> torch.Tensor:
    """[3, length]: the prompt's positions, then ``i + rope_delta`` for every later sequence index ``i``."""
    n = prompt_positions.shape[1]
    delta = int(prompt_positions.max()) + 1 - n if n else 0
    after = (torch.arange(n, length, dtype=torch.long) + delta).expand(3, -1)
    return torch.cat([prompt_positions.long().cpu(), after], dim=1)


def batch_positions(prompts: list[VisionPrompt], length: int, device) -> torch.Tensor:
    """[3, b, length] positions of a batch of prompts padded/continued to ``length`` tokens."""
    return torch.stack([continued_positions(p.positions, length) for p in prompts], dim=1).to(device)


def image_mask(model, tokens: torch.Tensor, prompt_lengths: list[int]) -> torch.Tensor:
    """[b, s] True at the image placeholders of each prompt (never at generated tokens or padding)."""
    inside = torch.arange(tokens.shape[1], device=tokens.device)[None] < torch.tensor(prompt_lengths,
                                                                                       device=tokens.device)[:, None]
    return (tokens == unwrap(model).image_token_id) & inside


def vision_rows(model, prompts: list[VisionPrompt], device) -> torch.Tensor | None:
    """[placeholders, hidden]: the merged image embeddings of every prompt's images, one vision-tower run; None
    where this rank holds no vision tower (a later pipeline stage) or no prompt has images."""
    tower = unwrap(model).vision_model
    with_images = [p for p in prompts if p.has_images]
    if tower is None or not with_images:
        return None
    pixels = torch.cat([p.pixel_values for p in with_images]).to(device)
    grids = torch.cat([p.image_grid_thw for p in with_images]).to(device)
    return tower(pixels, grids)


def merged_embeddings(model, tokens: torch.Tensor, rows: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[s, b, h] embeddings of ``tokens`` [b, s] with ``rows`` (one per True of ``mask`` [b, s], batch-major) at
    the image placeholders; the model's own ``embed`` gives the text embeddings."""
    embeddings = unwrap(model).embed(tokens)
    if rows.shape[0] != int(mask.sum()):
        raise ValueError(f"{int(mask.sum())} image placeholders but {rows.shape[0]} image embeddings")
    batch_major = embeddings.transpose(0, 1).masked_scatter(mask.unsqueeze(-1), rows.to(embeddings.dtype))
    return batch_major.transpose(0, 1).contiguous()


def rows_in_window(rows: torch.Tensor, mask: torch.Tensor, start: int, end: int) -> torch.Tensor:
    """The rows of the placeholders within sequence positions [start, end) of ``mask`` [b, S], batch-major."""
    index = (mask.flatten().cumsum(0) - 1).view_as(mask)
    window = mask[:, start:end]
    return rows[index[:, start:end][window]]
