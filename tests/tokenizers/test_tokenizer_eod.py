"""End-of-document comes from each tokenizer's own definition, never from a list of guessed spellings; the
preprocessed documents end with it; and the model's vocabulary follows the tokenizer (padded by
--make-vocab-size-divisible-by) as in Megatron-LM."""

from __future__ import annotations

import argparse
import json
import shutil

import pytest

from helpers import tokenizer_files as files
from mtmegatron.data.tokenizer import EOD, TokenizerError, load_tokenizer
from mtmegatron.data.tokenizer_build import build_tokenizer, sentencepiece_model_vocab_size
from mtmegatron.config.tokenizer_flags import add_tokenizer_args, check_tokenizer_args
from mtmegatron.data.section import Tokenizer

TINY_MODEL = ["--model", "llama3", "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
              "--seq-length", "32", "--max-position-embeddings", "32", "--train-iters", "4", "--vocab-size", "256"]


def _flags(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_tokenizer_args(parser)
    parser.add_argument("--vocab-size", type=int, default=None)
    parser.set_defaults(model=None)  # as the preprocess parser: the tokenizer checks ask the family
    args = parser.parse_args(argv)
    check_tokenizer_args(args, ValueError)
    return args


def _tok(argv: list[str]) -> Tokenizer:
    return Tokenizer.of(_flags(argv))


def _last_ids(prefix: str) -> set[int]:
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    dataset = IndexedDataset(prefix)
    return {int(dataset[i][-1]) for i in range(len(dataset))}


def test_deepseek_v3_style_config_gives_its_end_of_sentence_token(tokenizer_set):
    case = tokenizer_set["HuggingFaceTokenizer"]
    directory = case["flags"][case["flags"].index("--tokenizer-model") + 1]
    vocab = json.load(open(f"{directory}/tokenizer.json", encoding="utf-8"))["added_tokens"]
    eos_id = next(t["id"] for t in vocab if t["content"] == files.DEEPSEEK_EOS)
    bos_id = next(t["id"] for t in vocab if t["content"] == files.DEEPSEEK_BOS)
    typed = build_tokenizer(_tok(case["flags"]))
    assert typed.eod == eos_id != bos_id
    # a tokenizer.json file names the same tokenizer as its directory; so does the no---tokenizer-type path
    assert build_tokenizer(_tok(["--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model",
                                   f"{directory}/tokenizer.json"])).eod == eos_id
    assert load_tokenizer(directory).eod == eos_id
    assert _last_ids(case["prefix"]) == {eos_id}  # --append-eod wrote it after every document
    assert typed.detokenize(typed.tokenize(tokenizer_set["docs"][0])) == tokenizer_set["docs"][0]


def test_eod_of_each_kind_is_the_tokenizers_own(tokenizer_set):
    import sentencepiece

    sp_flags = tokenizer_set["SentencePieceTokenizer"]["flags"]
    model = sp_flags[sp_flags.index("--tokenizer-model") + 1]
    eos = sentencepiece.SentencePieceProcessor(model_file=model).eos_id()
    for kind in ("SentencePieceTokenizer", "GPTSentencePieceTokenizer", "Llama2Tokenizer"):
        tokenizer = build_tokenizer(_tok(["--tokenizer-type", kind, "--tokenizer-model", model]))
        assert tokenizer.eod == eos and tokenizer.vocab_size == 300
    assert _last_ids(tokenizer_set["SentencePieceTokenizer"]["prefix"]) == {eos}
    gpt2 = tokenizer_set["GPT2BPETokenizer"]["flags"]
    vocab = json.load(open(gpt2[gpt2.index("--vocab-file") + 1], encoding="utf-8"))
    assert build_tokenizer(_tok(gpt2)).eod == vocab[EOD]
    tik = build_tokenizer(_tok(tokenizer_set["TikTokenizer"]["flags"]))
    assert tik.eod == 2 and tik.vocab_size == 16 + 320  # "</s>" is the third of megatron-core's special tokens
    null = build_tokenizer(_tok(tokenizer_set["NullTokenizer"]["flags"]))
    assert (null.eod, null.vocab_size) == (64, 65)  # Megatron-LM: ids 0..N-1, then end-of-document N
    assert _last_ids(tokenizer_set["NullTokenizer"]["prefix"]) == {64}


def test_gpt2_bpe_encodes_as_gpt2(tokenizer_set):
    """Our GPT2BPETokenizer against transformers' GPT2Tokenizer on the same vocab.json + merges.txt."""
    import transformers

    flags = tokenizer_set["GPT2BPETokenizer"]["flags"]
    reference = transformers.GPT2Tokenizer.from_pretrained(str(tokenizer_set["root"] / "gpt2"))
    ours = build_tokenizer(_tok(flags))
    text = tokenizer_set["docs"][5] + " it's   odd  1234 ünïcödé 🙂\n\nend"
    assert ours.tokenize(text) == reference(text).input_ids
    assert ours.detokenize(ours.tokenize(text)) == text


def test_model_vocabulary_follows_the_tokenizer(tokenizer_set):
    from mtmegatron.data.resolve import resolve_data
    from mtmegatron.config.arguments import parse_args

    expected = {"HuggingFaceTokenizer": (320, 384), "GPT2BPETokenizer": (300, 384), "NullTokenizer": (65, 128),
                "TikTokenizer": (336, 384)}
    for kind, (vocab, padded) in expected.items():
        case = tokenizer_set[kind]
        args = parse_args(TINY_MODEL + case["flags"] + ["--data-path", case["prefix"]], world_size=1)
        resolve_data(args, progress=False)
        assert (args.vocab_size, args.padded_vocab_size) == (vocab, padded), kind
    # Megatron-LM's SentencePieceTokenizer adds <CLS> <SEP> <EOD> <MASK> and a <PAD> the model lacks
    case = tokenizer_set["SentencePieceTokenizer"]
    model = case["flags"][case["flags"].index("--tokenizer-model") + 1]
    assert sentencepiece_model_vocab_size(model) == 305
    args = parse_args(TINY_MODEL + case["flags"] + ["--data-path", case["prefix"],
                                                    "--make-vocab-size-divisible-by", "64"], world_size=1)
    resolve_data(args, progress=False)
    assert (args.vocab_size, args.padded_vocab_size) == (305, 320)
    # Megatron-LM's llama3 example: NullTokenizer on mock data
    args = parse_args(TINY_MODEL[:-2] + ["--vocab-size", "1000", "--mock-data", "--tokenizer-type", "NullTokenizer"],
                      world_size=1)
    assert resolve_data(args, progress=False).eod == 1000 and args.padded_vocab_size == 1024


def test_hf_config_without_a_usable_eos_token_is_refused(tokenizer_set, tmp_path):
    source = tokenizer_set["HuggingFaceTokenizer"]["flags"][-1]
    shutil.copytree(source, tmp_path / "tok")
    config_file = tmp_path / "tok" / "tokenizer_config.json"
    config = json.loads(config_file.read_text(encoding="utf-8"))
    del config["eos_token"]
    config_file.write_text(json.dumps(config, ensure_ascii=False), encoding="utf-8")
    with pytest.raises(TokenizerError, match="names no eos_token"):
        load_tokenizer(str(tmp_path / "tok"))
    with pytest.raises(TokenizerError, match="defines no end-of-document token .*no eos_token"):
        build_tokenizer(_tok(["--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model",
                                str(tmp_path / "tok")]))
    # preprocess without --append-eod never reads it (Megatron-LM's preprocess_data.py neither): accepted
    assert load_tokenizer(str(tmp_path / "tok"), require_eod=False).eod is None
    args = _flags(["--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", str(tmp_path / "tok")])
    assert build_tokenizer(Tokenizer.of(args), require_eod=False).eod is None
    from mtmegatron import cli

    (tmp_path / "docs.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in tokenizer_set["docs"][:3]))
    assert cli.main(["preprocess", "--input", str(tmp_path / "docs.jsonl"), "--output-prefix", str(tmp_path / "out"),
                     "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", str(tmp_path / "tok")]) == 0
    assert (tmp_path / "out_text_document.bin").stat().st_size > 0
    config["eos_token"] = "</never>"
    config_file.write_text(json.dumps(config), encoding="utf-8")
    with pytest.raises(TokenizerError, match="'</never>' is not in its vocabulary"):
        load_tokenizer(str(tmp_path / "tok"))
