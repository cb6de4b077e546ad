"""3-D rotary position ids (M-RoPE: temporal, height, width) of a token sequence holding image and video spans,
the positions a native-resolution vision-language model's language tower rotates by.

Rule (the same as HF transformers 5.24's ``get_rope_index`` of these models; tested equal):
- a text token's three positions are equal and count up by one;
- a vision span (a run of image or video placeholder tokens, one per merged 2x2 patch window) starting at
  position ``p`` with merged grid ``(t, h, w)`` gives its tokens ``(p + time(i), p + row, p + col)`` in grid order
  (frame group, row, column); ``time(i) = i`` for images; for videos ``time(i) = floor(i * interval)`` with
  ``interval = tokens_per_second * second_per_grid_t`` (or 1 where ``tokens_per_second`` is None, the first
  generation's rule);
- the text after a span continues at ``p + max(h, w)``;
- padding (``attention_mask == 0``) gets position 0 and is skipped: the unmasked tokens are positioned as if
  contiguous.
``rope_deltas`` (per sample: largest position + 1 - unmasked length) is what generation adds to the text
positions of later tokens.
May assume: torch; the grids are listed in the order their spans appear, across the batch (images and videos
each in their own list), and each span holds exactly t*h*w tokens of its grid (checked).
"""

from __future__ import annotations

import torch

TEXT, IMAGE, VIDEO = 0, 1, 2  # token types (HF's mm_token_type_ids)


def token_types(input_ids: torch.Tensor, image_token_id: int, video_token_id: int) -> torch.Tensor:
    """0 for text, 1 for an image placeholder, 2 for a video placeholder; the shape of ``input_ids``."""
    types = torch.zeros_like(input_ids, dtype=torch.int32)
    types[input_ids == image_token_id] = IMAGE
    types[input_ids == video_token_id] = VIDEO
    return types


def vision_span_positions(start: int, grid_thw, merge_size: int, interval=1) -> torch.Tensor:
    """[3, t*h*w] positions of one vision span starting at ``start`` (``grid_thw`` in unmerged patches)."""
    t, h, w = int(grid_thw[0]), int(grid_thw[1]) // merge_size, int(grid_thw[2]) // merge_size
    time = (torch.arange(t) * interval).long() + start
    rows, cols = torch.arange(h) + start, torch.arange(w) + start
    return torch.stack([time.repeat_interleave(h * w), rows.repeat_interleave(w).repeat(t), cols.repeat(t * h)])


def _runs(types: torch.Tensor) -> list[tuple[int, int, int]]:
    """(type, start, end) of each run of equal token types."""
    if types.numel() == 0:
        return []
    change = torch.nonzero(types[1:] != types[:-1]).flatten() + 1
    starts = torch.cat([torch.zeros(1, dtype=torch.long), change]).tolist()
    ends = starts[1:] + [types.numel()]
    kinds = types[starts].tolist()
    return list(zip(kinds, starts, ends))


def sample_positions(types: torch.Tensor, image_grids, video_grids, video_intervals,
                     merge_size: int) -> torch.Tensor:
    """[3, n] positions of one unpadded sample; consumes its grids/intervals from the given iterators."""
    positions = torch.empty(3, types.numel(), dtype=torch.long)
    current = 0
    for kind, start, end in _runs(types):
        if kind == TEXT:
            positions[:, start:end] = torch.arange(current, current + end - start)
            current += end - start
            continue
        grid = next(video_grids if kind == VIDEO else image_grids)
        interval = next(video_intervals) if kind == VIDEO else 1
        span = vision_span_positions(current, grid, merge_size, interval)
        if span.shape[1] != end - start:
            what = "video" if kind == VIDEO else "image"
            raise ValueError(f"an {what} span of {end - start} placeholder tokens at token {start} but its grid "
                             f"{[int(g) for g in grid]} has {span.shape[1]} merged tokens")
        positions[:, start:end] = span
        current += max(int(grid[1]), int(grid[2])) // merge_size
    return positions


def _video_intervals(num_videos: int, tokens_per_second, second_per_grid_ts):
    if tokens_per_second is None:
        return iter([1] * num_videos)
    if second_per_grid_ts is None:
        return iter([tokens_per_second] * num_videos)
    seconds = torch.as_tensor(second_per_grid_ts, dtype=torch.float32)
    return iter([tokens_per_second * s for s in seconds])


def rope_index(token_type_ids: torch.Tensor, image_grid_thw=None, video_grid_thw=None, attention_mask=None,
               merge_size: int = 2, tokens_per_second=None, second_per_grid_ts=None
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """(position_ids [3, b, s], rope_deltas [b, 1]) of a batch of token types [b, s] (``token_types``)."""
    token_type_ids = torch.as_tensor(token_type_ids)
    batch, length = token_type_ids.shape
    image_grids = iter(torch.as_tensor(image_grid_thw).tolist() if image_grid_thw is not None else [])
    video_list = torch.as_tensor(video_grid_thw).tolist() if video_grid_thw is not None else []
    video_grids = iter(video_list)
    intervals = _video_intervals(len(video_list), tokens_per_second, second_per_grid_ts)
    position_ids = torch.zeros(3, batch, length, dtype=torch.long)
    deltas = []
    for b in range(batch):
        keep = attention_mask[b].bool() if attention_mask is not None else torch.ones(length, dtype=torch.bool)
        positions = sample_positions(token_type_ids[b][keep], image_grids, video_grids, intervals, merge_size)
        position_ids[:, b, keep] = positions
        deltas.append(int(positions.max()) + 1 - positions.shape[1] if positions.numel() else 0)
    return position_ids, torch.tensor(deltas).unsqueeze(1)
