"""Samples -> the batch dict LLaVAModel's forward takes.

Batch contract (b samples, T = the longest text length in the batch):
- ``tokens`` int64 [b, T]: text ids with ``IMAGE_TOKEN_INDEX`` (-200) once per image;
- ``labels`` int64 [b, T]: next-token targets, -100 where not trained;
- ``loss_mask`` float32 [b, T]: 1 where ``labels`` is trained on;
- ``position_ids`` int64 [b, T]: 0..T-1;
- ``images`` float32 [total tiles in the batch, 3, img_h, img_w] (0 rows for a text-only batch), samples in
  order, each image's tiles in order;
- ``num_image_tiles`` int32 [images in the batch];
- ``num_image_tokens`` int64 scalar: image embeddings in the batch (sum of tiles * img_seq_len), for metrics.
Each sample spans exactly ``decoder_seq_length`` combined positions; a shorter text is padded at the end (pad
id, label -100, mask 0) to T, and LLaVAModel cuts the combined sequence back to ``decoder_seq_length``, so
only padding is ever dropped.
May assume: samples come from ``ConversationDataset`` (same img_h/img_w, same pad id).
"""

from __future__ import annotations

import torch

from mtmegatron.data.vision.template import IGNORE_INDEX


class Collator:
    """``collate_fn`` for a DataLoader; a class (not a closure) so worker processes can pickle it."""

    def __init__(self, pad_id: int, img_seq_len: int, img_h: int, img_w: int):
        self.pad_id, self.img_seq_len, self.img_h, self.img_w = pad_id, img_seq_len, img_h, img_w

    def __call__(self, samples: list[dict]) -> dict[str, torch.Tensor]:
        length = max(len(s["tokens"]) for s in samples)
        b = len(samples)
        tokens = torch.full((b, length), self.pad_id, dtype=torch.int64)
        labels = torch.full((b, length), IGNORE_INDEX, dtype=torch.int64)
        loss_mask = torch.zeros((b, length), dtype=torch.float32)
        for i, s in enumerate(samples):
            n = len(s["tokens"])
            tokens[i, :n], labels[i, :n], loss_mask[i, :n] = s["tokens"], s["labels"], s["loss_mask"]
        images = [s["images"] for s in samples if len(s["images"])]
        images = torch.cat(images) if images else torch.zeros((0, 3, self.img_h, self.img_w))
        num_image_tiles = torch.cat([s["num_image_tiles"] for s in samples]).to(torch.int32)
        return {
            "tokens": tokens,
            "labels": labels,
            "loss_mask": loss_mask,
            "position_ids": torch.arange(length, dtype=torch.int64).expand(b, length).contiguous(),
            "images": images,
            "num_image_tiles": num_image_tiles,
            "num_image_tokens": num_image_tiles.sum().to(torch.int64) * self.img_seq_len,
        }
