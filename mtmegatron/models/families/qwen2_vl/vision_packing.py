"""Index arithmetic of a native-resolution vision encoder whose micro-batch is one packed sequence of patches.

Layout (the one HF's Qwen2-VL image processor writes and the model reads): image/video ``i`` is a grid
``grid_thw[i] = (t, h, w)`` of patches (``t`` temporal patches, ``h x w`` spatial ones); its ``t*h*w`` rows follow
one another in ``pixel_values``, temporal slab by slab, and inside a slab the patches go block by block over the
``m x m`` merge blocks (``m`` = spatial merge size), row-major inside a block. Every function here works on that
order:
- ``cu_seqlens(grid_thw)``: the start of every temporal slab (each slab of each image attends only to itself);
- ``patch_rows_cols(grid_thw, m)``: each patch's (row, column) in its image, for the 2-D rotary embedding;
- ``vision_rotary_freqs(...)``: those positions as rotary angles ``[n, 1, 1, head_dim]`` (row angles, then column
  angles, the whole repeated: the non-interleaved layout megatron-core's ``apply_rotary_pos_emb`` takes);
- ``window_order(grid_thw, m, window)``: windowed attention (Qwen2.5-VL): the merge blocks regrouped window by
  window (``window`` merge blocks a side), and the windows' cu_seqlens in patches.
May assume: torch only; integer tensors on any device (the loops run over the few images of a micro-batch).
"""

from __future__ import annotations

import torch


def cu_seqlens(grid_thw: torch.Tensor) -> torch.Tensor:
    """[0, end of slab 0, ...] (int32): one attention sequence per temporal slab of every image."""
    slab = (grid_thw[:, 1] * grid_thw[:, 2]).repeat_interleave(grid_thw[:, 0])
    return torch.cat([slab.new_zeros(1), slab.cumsum(0)]).to(torch.int32)


def patch_rows_cols(grid_thw: torch.Tensor, merge: int) -> torch.Tensor:
    """[n, 2]: the (row, column) of every patch in its image, in the merge-block order described above."""
    out = []
    for t, h, w in grid_thw.tolist():
        rows = torch.arange(h, device=grid_thw.device).view(h // merge, 1, merge, 1).expand(-1, w // merge, -1, merge)
        cols = torch.arange(w, device=grid_thw.device).view(1, w // merge, 1, merge).expand(h // merge, -1, merge, -1)
        out.append(torch.stack([rows.reshape(-1), cols.reshape(-1)], dim=-1).repeat(t, 1))
    return torch.cat(out)


def vision_rotary_freqs(grid_thw: torch.Tensor, merge: int, head_dim: int, base: float = 10000.0) -> torch.Tensor:
    """Rotary angles [n, 1, 1, head_dim] (fp32): a quarter of the head's frequencies for the row, a quarter for the
    column, and the half repeated."""
    quarter = head_dim // 2
    inv_freq = 1.0 / (base ** (torch.arange(0, quarter, 2, dtype=torch.float32, device=grid_thw.device) / quarter))
    positions = patch_rows_cols(grid_thw, merge).float()
    angles = (positions[:, :, None] * inv_freq).reshape(positions.shape[0], -1)  # rows' angles, then columns'
    return torch.cat([angles, angles], dim=-1)[:, None, None, :]


def window_order(grid_thw: torch.Tensor, merge: int, window: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(order, window cu_seqlens): ``order`` lists the merge blocks (index in the packed order) window after window
    (windows of ``window x window`` merge blocks, row-major over each slab, cut at the image's edge); the
    cu_seqlens count patches (``merge**2`` per block)."""
    order, lengths, first = [], [], 0
    for t, h, w in grid_thw.tolist():
        rows, cols = h // merge, w // merge
        blocks = torch.arange(t * rows * cols, device=grid_thw.device).view(t, rows, cols) + first
        for slab in blocks:
            for r in range(0, rows, window):
                for c in range(0, cols, window):
                    piece = slab[r: r + window, c: c + window].reshape(-1)
                    order.append(piece)
                    lengths.append(piece.numel() * merge * merge)
        first += t * rows * cols
    lengths = torch.tensor(lengths, device=grid_thw.device)
    return torch.cat(order), torch.cat([lengths.new_zeros(1), lengths.cumsum(0)]).to(torch.int32)
