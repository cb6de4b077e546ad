"""Image placeholders expand to tiles * img_seq_len positions, with and without tiling, and the collated batch
goes through megatron-core's own LLaVAModel._preprocess_data to exactly decoder_seq_length positions with labels
that are the next token of the combined sequence."""

from __future__ import annotations

import types

import torch

from mtmegatron.data.vision.llava_collate import Collator
from mtmegatron.data.vision.images import ImageConfig
from mtmegatron.data.vision.llava_sample import combined_length, expand_image_tokens, fit_sample
from mtmegatron.data.vision.template import IGNORE_INDEX, IMAGE_TOKEN_INDEX as IMG

ISL = 4  # image embeddings per tile


def test_expand_without_tiling():
    tokens = torch.tensor([5, IMG, 6, 7, IMG, 8])
    out = expand_image_tokens(tokens, [1, 1], ISL)
    assert out.tolist() == [5] + [IMG] * 4 + [6, 7] + [IMG] * 4 + [8]
    assert combined_length(tokens, [1, 1], ISL) == len(out) == 12


def test_expand_with_tiling_and_thumbnail():
    config = ImageConfig(32, 32, use_tiling=True, max_num_tiles=4, use_thumbnail=True)
    tiles = config.num_tiles(64, 64)
    assert tiles == 5  # a 2x2 grid plus the thumbnail
    out = expand_image_tokens(torch.tensor([1, IMG, 2]), [tiles], ISL)
    assert out.tolist() == [1] + [IMG] * (5 * ISL) + [2]
    assert config.num_tiles(32, 32) == 1  # one tile: no thumbnail


def _sample(tokenizer, ids, trained, tiles, length, tile_value):
    sample = fit_sample(ids, trained, tiles, ISL, length, tokenizer.pad)
    sample["images"] = torch.full((sum(tiles), 3, 8, 8), float(tile_value))
    sample["num_image_tiles"] = torch.tensor(tiles, dtype=torch.int32)
    return sample


def test_batch_through_llava_preprocess(tokenizer):
    from megatron.core.models.multimodal.llava_model import LLaVAModel

    length = 40
    t = tokenizer.tokenize
    a, b = t("What colour"), t("red")
    samples = [  # 0, 1 and 2 images (2 and 5 tiles), different text lengths
        _sample(tokenizer, a + b, [False] * len(a) + [True] * len(b), [], length, 0),
        _sample(tokenizer, [IMG] + a + b, [False] * (1 + len(a)) + [True] * len(b), [2], length, 1),
        _sample(tokenizer, a + [IMG] + a + [IMG] + b, [False] * (2 * len(a) + 2) + [True] * len(b), [1, 5],
                length, 2),
    ]
    for s in samples:
        assert combined_length(s["tokens"], s["num_image_tiles"].tolist(), ISL) == length
    batch = Collator(tokenizer.pad, ISL, 8, 8)(samples)
    assert batch["tokens"].shape == (3, length)  # the text-only sample is the longest
    assert batch["images"].shape == (8, 3, 8, 8) and batch["num_image_tiles"].tolist() == [2, 1, 5]
    assert int(batch["num_image_tokens"]) == 8 * ISL

    fake = types.SimpleNamespace(add_decoder=True, pre_process=True, post_process=True, img_seq_len=ISL,
                                 _language_is_pipeline_parallel=True, _language_max_sequence_length=length,
                                 context_parallel_lm=1)
    language = batch["tokens"].float().unsqueeze(-1)  # a 1-wide "embedding": the token id itself
    images = torch.full((ISL, 8, 1), float(IMG))  # [img_seq_len, tiles, h]
    embedding, labels, loss_mask = LLaVAModel._preprocess_data(
        fake, images, language, batch["tokens"], batch["loss_mask"], batch["labels"], False, None, IMG,
        batch["num_image_tiles"])
    assert embedding.shape == (length, 3, 1) and labels.shape == loss_mask.shape == (3, length)
    for i, s in enumerate(samples):
        expanded = expand_image_tokens(s["tokens"], s["num_image_tiles"].tolist(), ISL)
        assert len(expanded) == length
        assert embedding[:, i, 0].long().tolist() == expanded.tolist()
        trained = loss_mask[i].nonzero().flatten().tolist()
        assert len(trained) == int(s["loss_mask"].sum())  # every trained text position survives
        for p in trained:  # the label of combined position p is the token at p + 1
            assert labels[i, p] == expanded[p + 1] and labels[i, p] != IGNORE_INDEX
