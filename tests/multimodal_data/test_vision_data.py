"""Native-resolution vision data equals HF transformers' for the Qwen2-VL family: image patches and grids
(``Qwen2VLImageProcessorPil``), video patch layout (the video processor's own ``patchify``: its module needs
torchvision, absent here, so the function is compiled from its source alone), M-RoPE position ids
(``get_rope_index`` of both generations, called on a config-only stand-in for the model), and the token ids of a
rendered conversation (HF tokenizer ``apply_chat_template`` with the released chat template, transcribed below,
and the processor's own pad expansion); bad records are one ``ConfigError`` line naming file:line."""

from __future__ import annotations

import ast
import functools
import importlib.util
import os
import types

import numpy as np
import pytest
import torch
from PIL import Image
from transformers import PreTrainedTokenizerFast
from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLModel
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLModel
from transformers.models.qwen2_vl.processing_qwen2_vl import Qwen2VLProcessor

from mm_samples import write_jsonl
from mtmegatron.data.vision.dynamic_resolution import (IMAGE_PIXELS, VIDEO_PIXELS, PatchConfig, image_patches,
                                                           normalized_frame, video_patches)
from mtmegatron.data.vision.mrope_positions import rope_index
from mtmegatron.data.vision.template import IGNORE_INDEX
from mtmegatron.data.vision.qwen_vl_chat import IMAGE_PAD, SPECIAL_TOKENS, VIDEO_PAD
from mtmegatron.data.vision.qwen_vl_samples import (VisionDataConfig, collate_padded, load_vision_conversations,
                                                       pack)
from mtmegatron.data.tokenizer import train_bpe
from mtmegatron.utils.errors import ConfigError

# The released Qwen2-VL chat template (chat_template.json of the Qwen2-VL-*-Instruct checkpoints), transcribed.
QWEN2_VL_CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}"
    "{% if add_vision_id %}Picture {{ image_count.value }}: {% endif %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}{% set video_count.value = video_count.value + 1 %}"
    "{% if add_vision_id %}Video {{ video_count.value }}: {% endif %}"
    "<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")

TEXT = ["What is in the picture? A red square and a blue circle. Describe the video. The ball rolls left.",
        "system user assistant You are a helpful assistant. Compare the two images."]


def random_image(rng, width, height, mode="RGB"):
    channels = 4 if mode == "RGBA" else 3
    return Image.fromarray(rng.integers(0, 256, (height, width, channels), dtype=np.uint8), mode)


def hf_video_patchify():
    """HF's ``Qwen2VLVideoProcessor.patchify`` and its default ``size``, compiled from the module's source (its
    module imports torchvision, which is not installed; the function itself needs only torch)."""
    spec = importlib.util.find_spec("transformers.models.qwen2_vl.video_processing_qwen2_vl")
    with open(spec.origin) as f:
        tree = ast.parse(f.read())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Qwen2VLVideoProcessor")
    function = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "patchify")
    function.returns = None
    for arg in function.args.args:
        arg.annotation = None
    namespace = {"torch": torch}
    exec(compile(ast.Module([function], []), spec.origin, "exec"), namespace)
    size = next(n.value for n in cls.body if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "size")
    return namespace["patchify"], eval(compile(ast.Expression(size), spec.origin, "eval"))


def hf_rope_index(model_class, tokens_per_second=2):
    """HF's ``get_rope_index`` bound to a stand-in holding only the config fields it reads."""
    vision = types.SimpleNamespace(spatial_merge_size=2, tokens_per_second=tokens_per_second)
    stand_in = types.SimpleNamespace(config=types.SimpleNamespace(vision_config=vision))
    stand_in.get_vision_position_ids = functools.partial(model_class.get_vision_position_ids, stand_in)
    return functools.partial(model_class.get_rope_index, stand_in)


def test_image_patches_equal_hf():
    rng = np.random.default_rng(0)
    hf = Qwen2VLImageProcessorPil()
    cases = [random_image(rng, 30, 20), random_image(rng, 57, 91), random_image(rng, 1500, 40),
             random_image(rng, 2000, 1500), random_image(rng, 50, 70, "RGBA"), random_image(rng, 8, 8)]
    for image in cases:
        expected = hf(images=[image], return_tensors="pt")
        pixel_values, grid = image_patches(image)
        assert list(grid) == expected["image_grid_thw"][0].tolist(), image.size
        assert IMAGE_PIXELS.grid(image.height, image.width) == grid  # what validation computes from the size
        assert torch.equal(pixel_values, expected["pixel_values"]), image.size
    above_max = cases[3]
    assert grid_pixels(image_patches(above_max)[1]) <= 28 * 28 * 1280 < above_max.width * above_max.height
    small = PatchConfig(min_pixels=28 * 28 * 4, max_pixels=28 * 28 * 16)  # non-default bounds reach HF too
    hf_small = Qwen2VLImageProcessorPil(min_pixels=small.min_pixels, max_pixels=small.max_pixels)
    for image in cases[:4]:
        expected = hf_small(images=[image], return_tensors="pt")
        pixel_values, grid = image_patches(image, small)
        assert list(grid) == expected["image_grid_thw"][0].tolist()
        assert torch.equal(pixel_values, expected["pixel_values"])


def grid_pixels(grid) -> int:
    return grid[1] * grid[2] * 14 * 14


def test_video_patches_equal_hf():
    rng = np.random.default_rng(1)
    hf_patchify, hf_size = hf_video_patchify()
    assert (VIDEO_PIXELS.min_pixels, VIDEO_PIXELS.max_pixels) == (hf_size["shortest_edge"], hf_size["longest_edge"])
    frames = [random_image(rng, 120, 90) for _ in range(3)]  # odd: the last frame is repeated
    pixel_values, grid = video_patches(frames)
    height, width = VIDEO_PIXELS.resized_size(90, 120)
    stacked = torch.from_numpy(np.stack([normalized_frame(f, height, width, VIDEO_PIXELS) for f in frames]))
    expected, grid_t, grid_h, grid_w = hf_patchify(None, stacked[None], 14, 2, 2)
    assert grid == (grid_t, grid_h, grid_w) == (2, height // 14, width // 14) == VIDEO_PIXELS.grid(90, 120, 3)
    assert torch.equal(pixel_values, expected[0])
    # a still video (two equal frames) is HF's image processor output for that frame, pixels included
    frame = random_image(rng, 97, 61)
    config = PatchConfig(min_pixels=VIDEO_PIXELS.min_pixels, max_pixels=VIDEO_PIXELS.max_pixels)
    hf = Qwen2VLImageProcessorPil(min_pixels=config.min_pixels, max_pixels=config.max_pixels)
    expected = hf(images=[frame], return_tensors="pt")
    pixel_values, grid = video_patches([frame, frame], config)
    assert list(grid) == expected["image_grid_thw"][0].tolist()
    assert torch.equal(pixel_values, expected["pixel_values"])


def _types(*parts) -> list[int]:
    out = []
    for part in parts:
        out += [0] * part if isinstance(part, int) else [part[0]] * part[1]
    return out


@pytest.mark.parametrize("generation", ["2", "2.5", "2.5-default-seconds"])
def test_rope_index_equal_hf(generation):
    images = torch.tensor([[1, 4, 6], [1, 8, 4], [1, 2, 2]])  # 6, 8 and 1 merged tokens
    videos = torch.tensor([[3, 4, 4], [2, 6, 2]])  # 12 and 6 merged tokens
    rows = [_types(7),  # text only
            _types(3, (1, 6), 4),  # one image
            _types(2, (1, 8), 3, (1, 1), 2),  # two images of different sizes
            _types(1, (2, 12), 2, (1, 6), 3, (2, 6), 1)]  # video, image, video
    length = max(len(r) for r in rows) + 2
    types_ = torch.zeros(len(rows), length, dtype=torch.long)
    mask = torch.zeros(len(rows), length, dtype=torch.long)
    for b, row in enumerate(rows):  # rows 0 and 2 left-padded, the others right-padded
        start = length - len(row) if b % 2 == 0 else 0
        types_[b, start:start + len(row)] = torch.tensor(row)
        mask[b, start:start + len(row)] = 1
    # images in the order their spans appear: row 1's, row 2's two, row 3's
    grids = {"image_grid_thw": torch.cat([images, images[:1]]),
             "video_grid_thw": videos}
    if generation == "2":
        reference = hf_rope_index(Qwen2VLModel)
        kwargs, ours = {}, {}
    else:
        seconds = None if generation.endswith("seconds") else torch.tensor([0.5, 1 / 3])
        reference = hf_rope_index(Qwen2_5_VLModel, tokens_per_second=2)
        kwargs, ours = {"second_per_grid_ts": seconds}, {"tokens_per_second": 2, "second_per_grid_ts": seconds}
    expected, expected_deltas = reference(torch.zeros_like(types_), types_, attention_mask=mask, **grids, **kwargs)
    positions, deltas = rope_index(types_, grids["image_grid_thw"], videos, mask, merge_size=2, **ours)
    assert torch.equal(positions, expected)
    assert torch.equal(deltas, expected_deltas)
    text_only, _ = rope_index(types_[:1, -7:])
    assert torch.equal(text_only, torch.arange(7).expand(3, 1, 7))


# ---- conversations ----------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def vision_tokenizer(tmp_path_factory):
    return train_bpe(TEXT * 4, 420, str(tmp_path_factory.mktemp("vtok")), SPECIAL_TOKENS)


@pytest.fixture(scope="module")
def media(tmp_path_factory):
    """Two images of different sizes and a 3-frame video (a folder of frames), written once."""
    folder = tmp_path_factory.mktemp("media")
    rng = np.random.default_rng(2)
    random_image(rng, 90, 60).save(folder / "wide.png")
    random_image(rng, 40, 130).save(folder / "tall.png")
    os.makedirs(folder / "clip")
    for k in range(3):
        random_image(rng, 64, 48).save(folder / "clip" / f"{k:03d}.png")
    return folder


CONVERSATION = [
    {"from": "human", "value": "Compare <image> and <image>.\nWhat is in the picture?"},
    {"from": "gpt", "value": "A red square and a blue circle."},
    {"from": "human", "value": "<video>\nDescribe the video."},
    {"from": "gpt", "value": "The ball rolls left."},
]


def hf_messages(conversation):
    """The conversation as HF chat messages: user text split at the tags into text/image/video parts."""
    messages = []
    for turn in conversation:
        role = "user" if turn["from"] == "human" else "assistant"
        parts, text = [], turn["value"]
        while text:
            cut = min((i for i in (text.find("<image>"), text.find("<video>")) if i >= 0), default=len(text))
            if cut:
                parts.append({"type": "text", "text": text[:cut]})
            if cut < len(text):
                kind = "image" if text.startswith("<image>", cut) else "video"
                parts.append({"type": kind})
                cut += len(kind) + 2
            text = text[cut:]
        messages.append({"role": role, "content": parts})
    return messages


def test_conversation_equals_hf_chat_template(vision_tokenizer, media, tmp_path):
    path = write_jsonl(tmp_path / "chat.jsonl", [{"id": "c1", "image": ["wide.png", "tall.png"], "video": "clip",
                                                   "fps": 1.0, "conversations": CONVERSATION}])
    config = VisionDataConfig(seq_length=512, tokens_per_second=2)
    sample = load_vision_conversations([path], str(media), vision_tokenizer, config)[0]

    hf_tokenizer = PreTrainedTokenizerFast(tokenizer_object=vision_tokenizer.tokenizer)
    text = hf_tokenizer.apply_chat_template(hf_messages(CONVERSATION), chat_template=QWEN2_VL_CHAT_TEMPLATE,
                                            tokenize=False)
    hf_images = Qwen2VLImageProcessorPil()([Image.open(media / n) for n in ("wide.png", "tall.png")],
                                           return_tensors="pt")
    video_grid = sample["video_grid_thw"]  # the video's grid (its patch layout is tested above)
    processor = types.SimpleNamespace(image_processor=types.SimpleNamespace(merge_size=2), image_token=IMAGE_PAD,
                                      video_processor=types.SimpleNamespace(merge_size=2), video_token=VIDEO_PAD)
    # the processor's own expansion: each pad becomes one pad per merged patch window of its image/video
    parts = text.split(IMAGE_PAD)
    assert len(parts) == 3
    text = "".join(part + (Qwen2VLProcessor.replace_image_token(processor, hf_images, k) if k < 2 else "")
                   for k, part in enumerate(parts))
    before, after = text.split(VIDEO_PAD)
    text = before + Qwen2VLProcessor.replace_video_token(processor, {"video_grid_thw": video_grid}, 0) + after
    expected_ids = hf_tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"][0]

    assert torch.equal(sample["tokens"], expected_ids)
    assert torch.equal(sample["pixel_values"], hf_images["pixel_values"])
    assert torch.equal(sample["image_grid_thw"], hf_images["image_grid_thw"])
    height, width = VIDEO_PIXELS.resized_size(48, 64)  # 3 frames -> 2 temporal patches, the video pixel budget
    assert video_grid.tolist() == [[2, height // 14, width // 14]]
    assert sample["pixel_values_videos"].shape == (2 * height * width // 14 ** 2, 3 * 2 * 14 * 14)
    # loss: exactly the answers and their <|im_end|>, as next-token targets
    trained = sample["labels"][sample["labels"] != IGNORE_INDEX]
    assert hf_tokenizer.decode(trained) == ("A red square and a blue circle.<|im_end|>"
                                            "The ball rolls left.<|im_end|>")
    assert torch.equal(sample["loss_mask"].bool(), sample["labels"] != IGNORE_INDEX)
    assert torch.equal(sample["labels"][:-1][sample["loss_mask"][:-1].bool()],
                       sample["tokens"][1:][sample["loss_mask"][:-1].bool()])
    # positions: HF's get_rope_index of the HF ids (with the video's seconds per grid: temporal patch / fps)
    hf_types = torch.zeros_like(expected_ids)[None]
    hf_types[0, expected_ids == hf_tokenizer.convert_tokens_to_ids(IMAGE_PAD)] = 1
    hf_types[0, expected_ids == hf_tokenizer.convert_tokens_to_ids(VIDEO_PAD)] = 2
    expected_positions, _ = hf_rope_index(Qwen2_5_VLModel, 2)(
        expected_ids[None], hf_types, image_grid_thw=hf_images["image_grid_thw"], video_grid_thw=video_grid,
        second_per_grid_ts=torch.tensor([2.0]))
    assert torch.equal(sample["position_ids"], expected_positions[:, 0])


def test_padded_and_packed_batches_keep_positions(vision_tokenizer, media, tmp_path):
    records = [{"id": "a", "image": "wide.png", "conversations": [
                   {"from": "human", "value": "<image> What is in the picture?"}, CONVERSATION[1]]},
               {"id": "b", "video": ["clip"], "conversations": CONVERSATION[2:]},
               {"id": "c", "conversations": [{"from": "human", "value": "Describe the video."},
                                             {"from": "gpt", "value": "The ball rolls left."}]}]
    path = write_jsonl(tmp_path / "few.jsonl", records)
    data = load_vision_conversations([path], str(media), vision_tokenizer, VisionDataConfig(seq_length=512))
    samples = [data[i] for i in range(len(data))]
    batch = collate_padded(samples, pad_id=0)
    image_id = vision_tokenizer.tokenizer.token_to_id(IMAGE_PAD)
    video_id = vision_tokenizer.tokenizer.token_to_id(VIDEO_PAD)
    types_ = (batch["tokens"] == image_id).long() + 2 * (batch["tokens"] == video_id).long()
    expected, _ = hf_rope_index(Qwen2VLModel)(batch["tokens"], types_, image_grid_thw=batch["image_grid_thw"],
                                              video_grid_thw=batch["video_grid_thw"],
                                              attention_mask=batch["attention_mask"])
    assert torch.equal(batch["position_ids"], expected)
    packed = pack(samples)
    lengths = [len(s["tokens"]) for s in samples]
    assert packed["cu_seqlens"].tolist() == [0, *np.cumsum(lengths).tolist()]
    for k, sample in enumerate(samples):
        lo, hi = packed["cu_seqlens"][k], packed["cu_seqlens"][k + 1]
        assert torch.equal(packed["position_ids"][:, 0, lo:hi], expected[:, k, :lengths[k]])
        assert packed["labels"][0, hi - 1] == IGNORE_INDEX
    assert packed["pixel_values"].shape[0] == int(packed["image_grid_thw"].prod(-1).sum())
    assert packed["pixel_values_videos"].shape[0] == int(packed["video_grid_thw"].prod(-1).sum())


def test_bad_records_are_one_line_naming_file_and_line(vision_tokenizer, media, tmp_path):
    (tmp_path / "corrupt.png").write_bytes(b"\x89PNG\r\n\x1a\n not really")
    os.makedirs(tmp_path / "empty_clip")
    (tmp_path / "junk.mp4").write_bytes(b"not a video")  # unreadable with or without PyAV
    good = {"id": "ok", "image": "wide.png",
            "conversations": [{"from": "human", "value": "<image> What?"}, CONVERSATION[1]]}
    cases = {
        "image file not found": {"image": "missing.png"},
        "cannot read image": {"image": str(tmp_path / "corrupt.png")},
        "no frames": {"video": str(tmp_path / "empty_clip"), "image": None},
        "2 <image> tag(s) but 1 image(s)": {"conversations": [{"from": "human", "value": "<image><image> What?"},
                                                            CONVERSATION[1]]},
        "1 <image> tag(s) but 2 image(s)": {"image": ["wide.png", "tall.png"]},
        "nested list": {"image": None, "video": ["clip/000.png"]},
        "frames differ in size": {"image": None, "video": [["wide.png", "tall.png"]]},
        "cannot read video": {"image": None, "video": str(tmp_path / "junk.mp4")},
    }
    for reason, change in cases.items():
        record = {**good, **change, "id": reason}
        if record.get("image") is None:
            record.pop("image")
            record["conversations"] = [{"from": "human", "value": "<video> What?"}, CONVERSATION[1]]
        path = write_jsonl(tmp_path / "bad.jsonl", [good, record])
        with pytest.raises(ConfigError) as error:
            load_vision_conversations([path], str(media), vision_tokenizer, VisionDataConfig(seq_length=512))
        message = str(error.value)
        assert f"{path}:2" in message and reason in message and "\n" not in message, message
    skipped = load_vision_conversations(
        [write_jsonl(tmp_path / "mixed.jsonl", [good, {**good, "image": "missing.png"}])], str(media),
        vision_tokenizer, VisionDataConfig(seq_length=512, skip_bad_samples=True))
    assert len(skipped) == 1 and len(skipped.bad_samples) == 1 and ":2 (id 'ok')" in skipped.bad_samples[0]
    assert skipped[0]["image_grid_thw"].tolist() == [[1, 4, 6]]  # the good sample reads back
