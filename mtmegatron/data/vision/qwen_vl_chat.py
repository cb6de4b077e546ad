"""The Qwen2-VL / Qwen2.5-VL chat template: conversation turns with ``<image>``/``<video>`` tags -> token ids and
which of them are trained.

Text (what the released models' chat template renders, with every image/video expanded as their processor does)::

    <|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n      (when the first turn is not a system turn)
    <|im_start|>user\\n...<|vision_start|><|image_pad|> x n<|vision_end|>...<|im_end|>\\n
    <|im_start|>assistant\\n{answer}<|im_end|>\\n

An image of patch grid (t, h, w) becomes ``t*h*w / merge_size**2`` ``<|image_pad|>`` tokens (one per merged patch
window), a video likewise with ``<|video_pad|>``. Turn contents are used as written (no stripping). The whole text
is tokenized at once (so ids equal the tokenizer's on the same text); a token is trained when it starts inside an
answer or its closing ``<|im_end|>`` (the role header and the newline after ``<|im_end|>`` are not).
May assume: the tokenizer is an ``HFTokenizer`` (data/tokenizer.py) with these special tokens (checked).
"""

from __future__ import annotations

import re

import numpy as np

from mtmegatron.data.vision.template import IMAGE_TAG, TemplateError, Turn
from mtmegatron.data.vision.qwen_vl_records import VIDEO_TAG

DEFAULT_SYSTEM = "You are a helpful assistant."
IM_START, IM_END = "<|im_start|>", "<|im_end|>"
VISION_START, VISION_END = "<|vision_start|>", "<|vision_end|>"
IMAGE_PAD, VIDEO_PAD = "<|image_pad|>", "<|video_pad|>"
SPECIAL_TOKENS = (IM_START, IM_END, VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD)
_TAG = re.compile(re.escape(IMAGE_TAG) + "|" + re.escape(VIDEO_TAG))


def special_ids(tokenizer) -> dict[str, int]:
    """The template's special token ids; a ``TemplateError`` naming the first one the tokenizer lacks."""
    ids = {}
    for token in SPECIAL_TOKENS:
        token_id = tokenizer.tokenizer.token_to_id(token)
        if token_id is None:
            raise TemplateError(f"the vision chat template needs the special token {token} but the tokenizer "
                                f"{tokenizer.source} has none")
        ids[token] = token_id
    return ids


def _expanded(content: str, image_tokens, video_tokens) -> str:
    def span(match) -> str:
        if match[0] == IMAGE_TAG:
            return VISION_START + IMAGE_PAD * next(image_tokens) + VISION_END
        return VISION_START + VIDEO_PAD * next(video_tokens) + VISION_END

    return _TAG.sub(span, content)


def render_text(turns: list[Turn], image_tokens: list[int], video_tokens: list[int]
                ) -> tuple[str, list[tuple[int, int]]]:
    """(text, character spans that are trained) with the k-th image tag expanded to ``image_tokens[k]`` pads."""
    images, videos = iter(image_tokens), iter(video_tokens)
    text, trained = "", []
    if turns[0].role != "system":
        text += f"{IM_START}system\n{DEFAULT_SYSTEM}{IM_END}\n"
    for turn in turns:
        text += f"{IM_START}{turn.role}\n"
        start = len(text)
        text += _expanded(turn.content, images, videos) + IM_END
        if turn.role == "assistant":
            trained.append((start, len(text)))
        text += "\n"
    return text, trained


def render_vision_chat(turns: list[Turn], tokenizer, image_tokens: list[int], video_tokens: list[int]
                       ) -> tuple[np.ndarray, np.ndarray]:
    """(token ids int64 [n], trained bool [n]) of a conversation; ``*_tokens``: merged tokens per image/video."""
    text, spans = render_text(turns, image_tokens, video_tokens)
    encoding = tokenizer.tokenizer.encode(text, add_special_tokens=False)
    ids = np.asarray(encoding.ids, dtype=np.int64)
    starts = np.asarray([start for start, _ in encoding.offsets], dtype=np.int64)
    trained = np.zeros(len(ids), dtype=bool)
    for begin, end in spans:
        trained |= (starts >= begin) & (starts < end)
    return ids, trained
