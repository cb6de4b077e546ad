"""The JSONL loader: every bad-sample case stops with one message naming the file, line and id (or is skipped
and counted with skip_bad_samples); truncation never cuts an image; every sample spans decoder_seq_length."""

from __future__ import annotations

import os
import re

import pytest
import torch
from mm_samples import qa, write_jsonl, write_png

from mtmegatron.data.vision.build import build_multimodal_datasets
from mtmegatron.data.vision.section import LlavaData
from mtmegatron.data.vision.llava_conversations import ConversationDataset, LoaderConfig
from mtmegatron.data.vision.images import ImageConfig
from mtmegatron.data.vision.records import BadSample
from mtmegatron.data.vision.llava_sample import combined_length
from mtmegatron.data.vision.template import IMAGE_TOKEN_INDEX as IMG
from mtmegatron.utils.errors import ConfigError

ISL = 4


def config(length=64, skip=False, tiling=False):
    image = ImageConfig(16, 16, use_tiling=tiling, max_num_tiles=4, use_thumbnail=tiling)
    return LoaderConfig("llama3", ISL, length, image, skip)


@pytest.fixture
def folder(tmp_path):
    write_png(tmp_path / "a.png", 16, 16)
    write_png(tmp_path / "b.png", 32, 16, (0, 0, 255))
    write_png(tmp_path / "big.png", 32, 32)
    png = (tmp_path / "a.png").read_bytes()
    (tmp_path / "truncated.png").write_bytes(png[: len(png) // 2])
    (tmp_path / "garbage.png").write_bytes(b"not an image at all")
    return tmp_path


LONG = "<image>\n" + "What colour is the shape? " * 40

BAD_CASES = [  # (record, message)
    (qa("missing.png"), r"image file not found: .*missing\.png"),
    (qa("garbage.png"), r"cannot read image .*garbage\.png"),
    (qa("truncated.png"), r"cannot read image .*truncated\.png"),
    (qa("a.png", question="<image><image>\nWhat?"), r"2 <image> tag\(s\) but 1 image\(s\)"),
    (qa(["a.png", "b.png"], question="<image>\nWhat?"), r"1 <image> tag\(s\) but 2 image\(s\)"),
    (qa(None), r"1 <image> tag\(s\) but 0 image\(s\)"),
    (qa("a.png", question="What colour is the shape? " * 20 + "<image>"), r"image 1 .* past --decoder-seq-length 64"),
    (qa("a.png", question=LONG), r"no assistant answer token fits"),
    ('{"id": "s", "conversations": [', r"malformed JSON"),
    ({"id": "s", "image": "a.png", "conversations": [{"from": "gpt", "value": "hi"},
                                                     {"from": "human", "value": "<image>"}]}, r"must alternate"),
    ({"id": "s", "conversations": [{"from": "robot", "value": "hi"}]}, r"role 'robot'"),
    ({"id": "s", "conversations": [{"from": "human", "value": "hi"}]}, r"no assistant answer"),
    ({"id": "s", "image": "a.png", "conversations": [{"from": "human", "value": "hi"},
                                                     {"from": "gpt", "value": "<image>"}]}, r"outside a user turn"),
    ({"id": "s", "image": 3, "conversations": []}, r"'image' must be a file name"),
]


@pytest.mark.parametrize("record, message", BAD_CASES, ids=[m[:24] for _, m in BAD_CASES])
def test_bad_sample_message_names_sample_and_file(tokenizer, folder, record, message):
    path = write_jsonl(folder / "data.jsonl", [qa("a.png", sample_id="good"), record])
    with pytest.raises(BadSample) as err:
        ConversationDataset([path], None, tokenizer, config(), progress=False, cache=False)
    text = str(err.value)
    assert re.search(message, text), text
    assert f"{path}:2" in text  # the file and the line
    if not message.startswith("malformed"):
        assert "(id 's')" in text
    assert "--skip-bad-samples" in text


def test_skip_bad_samples_counts_them(tokenizer, folder):
    records = [qa("a.png", sample_id="good1")] + [r for r, _ in BAD_CASES] + [qa("b.png", sample_id="good2"),
                                                                             qa(None, question="Hi?", answer="one")]
    path = write_jsonl(folder / "data.jsonl", records)
    dataset = ConversationDataset([path], None, tokenizer, config(skip=True), progress=False)
    assert len(dataset) == 3 and len(dataset.bad_samples) == len(BAD_CASES)
    assert [s[1] for s in dataset.bad_samples] == list(range(2, 2 + len(BAD_CASES)))  # line numbers
    for i in range(len(dataset)):  # every kept sample loads
        assert combined_length(dataset[i]["tokens"], dataset[i]["num_image_tiles"].tolist(), ISL) == 64
    # the cached index is reused; without skipping it names the first bad sample again
    with pytest.raises(BadSample, match=rf"{re.escape(path)}:2 .*image file not found.*"
                                        rf"\({len(BAD_CASES) - 1} more bad sample"):
        ConversationDataset([path], None, tokenizer, config(), progress=False)


def test_truncation_keeps_image_spans(tokenizer, folder):
    long_answer = "red green blue " * 30
    records = [qa(["a.png", "b.png"], question="<image> and <image>\nWhat colour?", answer=long_answer),
               qa("big.png", question="Describe the image. <image>", answer=long_answer)]
    path = write_jsonl(folder / "data.jsonl", records)
    dataset = ConversationDataset([path], None, tokenizer, config(length=48, tiling=True), progress=False,
                                  cache=False)
    assert [e[3] for e in dataset.entries] == [[1, 3], [5]]  # b.png: 2x1 + thumbnail; big.png: 2x2 + thumbnail
    for i in range(2):
        s = dataset[i]
        tiles = s["num_image_tiles"].tolist()
        assert combined_length(s["tokens"], tiles, ISL) == 48
        assert (s["tokens"] == IMG).sum() == len(tiles) and s["images"].shape[0] == sum(tiles)
        assert s["loss_mask"].sum() > 0 and (s["tokens"] != tokenizer.pad).all()  # cut, not padded


def test_decoder_seq_length_too_short_for_any_image_is_a_bad_sample(tokenizer, folder):
    path = write_jsonl(folder / "data.jsonl", [qa("big.png", question="<image>\nWhat?")])
    with pytest.raises(BadSample, match=r"image 1 \(5 tile\(s\) x 4 embeddings\) spans positions \d+\.\.\d+, "
                                        r"past --decoder-seq-length 20"):
        ConversationDataset([path], None, tokenizer, config(length=20, tiling=True), progress=False, cache=False)


def test_image_folder_and_prepended_tags(tokenizer, folder):
    os.makedirs(folder / "data")
    path = write_jsonl(folder / "data" / "d.jsonl", [qa(["a.png", "b.png"], question="Compare them.")])
    dataset = ConversationDataset([path], str(folder), tokenizer, config(), progress=False, cache=False)
    assert (dataset[0]["tokens"] == IMG).sum() == 2  # two <image>\n prepended, as LLaVA does
    with pytest.raises(BadSample, match="image file not found"):  # default folder: the JSONL's directory
        ConversationDataset([path], None, tokenizer, config(), progress=False, cache=False)


def _args(**kw):
    base = dict(data_path=None, valid_data_path=None, img_h=32, img_w=32, vocab_size=1024, decoder_seq_length=128, seed=1, split="9,1,0",
                prompt_format="llama3", vision_model_type="clip", use_tiling=False, max_num_tiles=1,
                use_thumbnail=False, skip_bad_samples=False, image_folder=None, tokenizer_model=None)
    return LlavaData(**{**base, **kw})


def test_build_embedded_and_user_data(tokenizer, folder, capsys):
    train, valid, tok, info = build_multimodal_datasets(_args(), img_seq_len=16, progress=False)
    assert info["train_samples"] == 4000 and info["valid_samples"] == 256 and info["bad_samples"] == 0
    batch = info["collate_fn"]([train[i] for i in range(4)])
    assert set(batch) == {"tokens", "labels", "loss_mask", "position_ids", "images", "num_image_tiles",
                          "num_image_tokens"}
    assert batch["images"].shape == (4, 3, 32, 32) and int(batch["num_image_tokens"]) == 64
    for row, tiles in zip(batch["tokens"], batch["num_image_tiles"].split(1)):
        assert combined_length(row, tiles.tolist(), 16) >= 128  # == 128 before batch padding
    plain = build_multimodal_datasets(_args(prompt_format="plain"), img_seq_len=16, progress=False)[0]
    caption = plain[0]["labels"][plain[0]["loss_mask"] > 0].tolist()
    assert "shape" in tok.detokenize(caption)

    records = [qa("a.png", sample_id=f"g{i}") for i in range(20)] + [qa("missing.png", sample_id="m")]
    path = write_jsonl(folder / "user.jsonl", records)
    with pytest.raises(ConfigError, match=r"user\.jsonl:21 \(id 'm'\): image file not found"):
        build_multimodal_datasets(_args(data_path=[path]), img_seq_len=4, tokenizer=tokenizer, progress=False)
    train, valid, _, info = build_multimodal_datasets(_args(data_path=[path], skip_bad_samples=True),
                                                      img_seq_len=4, tokenizer=tokenizer)
    assert (len(train), len(valid), info["bad_samples"]) == (18, 2, 1)
    assert "skipped 1 bad sample" in info["summary"]
    assert re.search(r"skipped 1 bad sample\(s\); first: .*user\.jsonl:21 \(id 'm'\)", capsys.readouterr().err)
    # no --tokenizer-model: a BPE with the template's special tokens is trained on the conversations
    _, _, bpe, _ = build_multimodal_datasets(_args(data_path=[path], skip_bad_samples=True), img_seq_len=4,
                                             progress=False)
    assert bpe.tokenizer.token_to_id("<|eot_id|>") is not None
    with pytest.raises(ConfigError, match="more than the model's --vocab-size 100"):
        build_multimodal_datasets(_args(data_path=[path], vocab_size=100), img_seq_len=4, tokenizer=tokenizer)


def test_dataloader_with_workers(tokenizer, folder):
    path = write_jsonl(folder / "d.jsonl", [qa("a.png", sample_id=f"g{i}") for i in range(8)])
    train, _, _, info = build_multimodal_datasets(_args(data_path=[path], split="1,0,0", img_h=16, img_w=16),
                                                  img_seq_len=4, tokenizer=tokenizer, progress=False)
    loader = torch.utils.data.DataLoader(train, batch_size=4, num_workers=1, collate_fn=info["collate_fn"])
    batches = list(loader)
    assert len(batches) == 2 and batches[0]["tokens"].shape[0] == 4


def test_json_array_files(tokenizer, folder):
    import json

    records = [qa("a.png", sample_id="g1"), qa(None, question="Hi?", answer="one", sample_id="g2"),
               qa("missing.png", sample_id="m")]
    path = folder / "llava.json"
    path.write_text(json.dumps(records, indent=1))
    with pytest.raises(BadSample, match=r"llava\.json:record 3 \(id 'm'\): image file not found"):
        ConversationDataset([str(path)], None, tokenizer, config(), progress=False, cache=False)
    dataset = ConversationDataset([str(path)], None, tokenizer, config(skip=True), progress=False)
    assert len(dataset) == 2 and len(dataset.bad_samples) == 1
    jsonl = ConversationDataset([write_jsonl(folder / "same.jsonl", records[:2])], None, tokenizer, config(),
                                progress=False)
    for i in range(2):
        for key in ("tokens", "labels", "loss_mask", "images"):
            assert torch.equal(dataset[i][key], jsonl[i][key])
    (folder / "broken.json").write_text("[{")
    with pytest.raises(ValueError, match="broken.json: not valid JSON"):
        ConversationDataset([str(folder / "broken.json")], None, tokenizer, config(), progress=False)
