"""Token ids of a rendered conversation -> one fixed-size training sample in LLaVAModel's text coordinates.

LLaVAModel (megatron-core 0.16, ``_preprocess_data``) replaces each ``IMAGE_TOKEN_INDEX`` in ``tokens`` by
``num_tiles * img_seq_len`` embeddings, so a sample whose text is ``text_len`` long with images of ``t_k``
tiles spans ``text_len - num_images + sum(t_k) * img_seq_len`` positions. Every sample here is padded so that
this combined length is exactly ``decoder_seq_length`` (pipeline parallelism needs one size): its text length
is ``decoder_seq_length - sum(t_k * img_seq_len - 1)``.

Labels are next-token targets in text coordinates: ``labels[i]`` is the token after ``tokens[i]`` (after an
image token: the first text token after the image), ``IGNORE_INDEX`` (-100) unless that target belongs to an
assistant answer; ``loss_mask`` is 1 exactly where ``labels`` is not -100. Image positions and the token just
before an image (whose target is the image) are never trained, as LLaVAModel masks them.
Truncation keeps whole image spans: text is cut after the last position that fits; a sample where an image span
would not fit is a ``SampleDoesNotFit``, and so is one with no answer token left.
May assume: ``ids``/``trained`` come from ``template.render``.
"""

from __future__ import annotations

import numpy as np
import torch

from mtmegatron.data.vision.template import IGNORE_INDEX, IMAGE_TOKEN_INDEX


class SampleDoesNotFit(ValueError):
    """The sample cannot be cut to decoder_seq_length without cutting an image or losing every answer."""


def combined_length(tokens, num_tiles, img_seq_len: int) -> int:
    """Positions the language model sees for ``tokens`` once each image token becomes its embeddings."""
    num_images = int((np.asarray(tokens) == IMAGE_TOKEN_INDEX).sum())
    return len(tokens) - num_images + int(sum(num_tiles)) * img_seq_len


def expand_image_tokens(tokens, num_tiles, img_seq_len: int) -> torch.Tensor:
    """``tokens`` [text_len] with each image token repeated ``tiles * img_seq_len`` times: what the language model
    sees, position by position (image embeddings shown as ``IMAGE_TOKEN_INDEX``)."""
    tokens = torch.as_tensor(tokens)
    is_image = tokens == IMAGE_TOKEN_INDEX
    if int(is_image.sum()) != len(num_tiles):
        raise ValueError(f"{int(is_image.sum())} image tokens but {len(num_tiles)} tile counts")
    repeats = torch.ones_like(tokens)
    repeats[is_image] = torch.as_tensor(num_tiles, dtype=tokens.dtype) * img_seq_len
    return torch.repeat_interleave(tokens, repeats)


def text_length(num_tiles, img_seq_len: int, decoder_seq_length: int) -> int:
    """The text length at which a sample with these images spans exactly ``decoder_seq_length`` positions."""
    return decoder_seq_length - sum(t * img_seq_len - 1 for t in num_tiles)


def fit_sample(ids: list[int], trained: list[bool], num_tiles: list[int], img_seq_len: int,
               decoder_seq_length: int, pad_id: int) -> dict[str, torch.Tensor]:
    """tokens/labels/loss_mask of text length ``text_length(...)`` (combined length == decoder_seq_length).

    Raises ``SampleDoesNotFit`` naming the first image that does not fit, or when no answer token fits."""
    ids_arr = np.asarray(ids, dtype=np.int64)
    is_image = ids_arr == IMAGE_TOKEN_INDEX
    assert int(is_image.sum()) == len(num_tiles), "one tile count per image token"
    span = np.ones(len(ids_arr), dtype=np.int64)
    span[is_image] = np.asarray(num_tiles, dtype=np.int64) * img_seq_len
    end = np.cumsum(span)  # combined position just past each token
    keep = int(np.searchsorted(end, decoder_seq_length, side="right"))  # tokens that fit entirely
    image_positions = np.flatnonzero(is_image)
    for k, position in enumerate(image_positions):
        if position >= keep:
            start = int(end[position] - span[position])
            raise SampleDoesNotFit(f"image {k + 1} ({num_tiles[k]} tile(s) x {img_seq_len} embeddings) spans "
                                   f"positions {start}..{int(end[position]) - 1}, past --decoder-seq-length "
                                   f"{decoder_seq_length}")
    length = text_length(num_tiles, img_seq_len, decoder_seq_length)
    tokens = np.full(length, pad_id, dtype=np.int64)
    labels = np.full(length, IGNORE_INDEX, dtype=np.int64)
    tokens[:keep] = ids_arr[:keep]
    targets = ids_arr[1:keep + 1]  # the target of kept token i; the one after the cut is still a valid target
    target_trained = np.asarray(trained[1:keep + 1], dtype=bool)
    target_trained &= ~is_image[:len(targets)]  # LLaVAModel masks the last image embedding's prediction
    target_trained &= targets != IMAGE_TOKEN_INDEX
    labels[:len(targets)] = np.where(target_trained, targets, IGNORE_INDEX)
    loss_mask = (labels != IGNORE_INDEX).astype(np.float32)
    if not loss_mask.any():
        raise SampleDoesNotFit(f"no assistant answer token fits in --decoder-seq-length {decoder_seq_length}")
    return {"tokens": torch.from_numpy(tokens), "labels": torch.from_numpy(labels),
            "loss_mask": torch.from_numpy(loss_mask)}
