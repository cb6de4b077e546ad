"""A hand-written conversation through each template and fit_sample: tokens, labels and loss mask checked
position by position (labels -100 everywhere except assistant answers and their end-of-turn token)."""

from __future__ import annotations

import pytest

from mtmegatron.data.vision.llava_sample import fit_sample
from mtmegatron.data.vision.template import (IGNORE_INDEX as IGN, IMAGE_TOKEN_INDEX as IMG, TemplateError,
                                                 Turn, check_template, render)

TURNS = [Turn("user", "<image>\nWhat colour is the shape?"), Turn("assistant", "red"),
         Turn("user", "How many shapes are there?"), Turn("assistant", "one")]


def ids(tokenizer, token):
    return tokenizer.tokenizer.token_to_id(token)


def test_llama3_tokens_labels_mask(tokenizer):
    t = tokenizer.tokenize
    bos, sh, eh, eot = (ids(tokenizer, s) for s in ("<|begin_of_text|>", "<|start_header_id|>",
                                                     "<|end_header_id|>", "<|eot_id|>"))
    prompt1 = [bos, sh, *t("user"), eh, *t("\n\n"), IMG, *t("\nWhat colour is the shape?"), eot,
               sh, *t("assistant"), eh, *t("\n\n")]
    answer1 = [*t("red"), eot]
    prompt2 = [sh, *t("user"), eh, *t("\n\nHow many shapes are there?"), eot, sh, *t("assistant"), eh, *t("\n\n")]
    answer2 = [*t("one"), eot]
    expected = prompt1 + answer1 + prompt2 + answer2
    got, trained = render("llama3", TURNS, tokenizer)
    assert got == expected
    assert trained == [False] * len(prompt1) + [True] * len(answer1) + [False] * len(prompt2) + [True] * len(answer2)

    img_seq_len, length = 4, len(expected) + 3 + 5  # 5 padding positions
    sample = fit_sample(got, trained, [1], img_seq_len, length, pad_id=tokenizer.pad)
    text_len = length - 3  # one image of 1 tile: 4 positions instead of 1
    pad = tokenizer.pad
    assert sample["tokens"].tolist() == expected + [pad] * (text_len - len(expected))
    # labels[i] = the token after position i when that token is part of an answer
    labels = [IGN] * (len(prompt1) - 1) + answer1 + [IGN] * len(prompt2) + answer2
    labels += [IGN] * (text_len - len(labels))
    assert sample["labels"].tolist() == labels
    assert sample["loss_mask"].tolist() == [float(v != IGN) for v in labels]
    assert sum(sample["loss_mask"].tolist()) == len(answer1) + len(answer2)


def test_plain_tokens_labels_mask(tokenizer):
    t = tokenizer.tokenize
    turns = [Turn("user", "<image>\nDescribe the image."), Turn("assistant", "A cat sits on a mat.")]
    got, trained = render("plain", turns, tokenizer)
    bos = ids(tokenizer, "<|begin_of_text|>")
    caption = [*t("A cat sits on a mat."), tokenizer.eod]
    assert got == [bos, IMG, *caption]  # the user's text is dropped: image, then caption
    assert trained == [False, False] + [True] * len(caption)
    sample = fit_sample(got, trained, [2], 3, len(got) + 5 + 2, pad_id=tokenizer.pad)
    # 2 tiles x 3 embeddings: the image takes 6 positions, so the text is 5 shorter than decoder_seq_length
    assert sample["tokens"].tolist() == got + [tokenizer.pad] * 2
    # the first caption token is predicted from the last image embedding, which LLaVAModel never trains
    assert sample["labels"].tolist() == [IGN, IGN, *caption[1:], IGN, IGN, IGN]
    assert sample["loss_mask"].tolist() == [0, 0] + [1] * (len(caption) - 1) + [0, 0, 0]


def test_vicuna_trains_only_answers(tokenizer):
    got, trained = render("vicuna_v1", TURNS, tokenizer)
    answers = [i for i, flag in zip(got, trained) if flag]
    assert tokenizer.detokenize(answers) == f" red{tokenizer.detokenize([tokenizer.eod])} one" \
                                           f"{tokenizer.detokenize([tokenizer.eod])}"
    assert got.count(IMG) == 1 and not trained[got.index(IMG)]


def test_unknown_template_and_missing_special_token(tokenizer, tmp_path):
    with pytest.raises(TemplateError, match="unknown --prompt-format 'chatml'"):
        check_template("chatml", tokenizer)
    from mtmegatron.data.tokenizer import train_bpe

    bare = train_bpe(["some text"] * 4, 300, str(tmp_path / "bare"))
    with pytest.raises(TemplateError, match=r"llama3 needs the special token <\|begin_of_text\|>"):
        check_template("llama3", bare)
    check_template("plain", bare)  # plain needs no special token
