"""Bad tokenizer flags are one line, before anything is loaded: in pretrain (ConfigError, exit 2 before any
process group) and in `mtmegatron preprocess` (exit 2, one stderr line)."""

from __future__ import annotations

import pytest

from mtmegatron import cli
from mtmegatron.config.arguments import parse_args
from mtmegatron.utils.errors import ConfigError

TINY_MODEL = ["--model", "llama3", "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
              "--seq-length", "32", "--max-position-embeddings", "32", "--train-iters", "4", "--vocab-size", "256"]


@pytest.mark.parametrize("flags, message", [
    (["--tokenizer-type", "BertWordPieceLowerCase", "--vocab-file", "v.txt"],
     "--tokenizer-type BertWordPieceLowerCase: BERT models are not supported; GPT-style only"),
    (["--tokenizer-type", "SFTTokenizer"], "SFT prompt formats are not supported"),
    (["--tokenizer-type", "Bogus"], "argument --tokenizer-type: invalid choice: 'Bogus'"),
    (["--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", "/nonexistent/vocab.json", "--merge-file", "m.txt"],
     "--vocab-file /nonexistent/vocab.json: no such file"),
    (["--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", "README.md"], "GPT2BPETokenizer needs --merge-file"),
    (["--tokenizer-type", "SentencePieceTokenizer"], "needs --tokenizer-model \\(a SentencePiece .model file\\)"),
    (["--tokenizer-type", "TikTokenizer", "--tokenizer-model", "README.md"], "needs --tiktoken-pattern v1 or v2"),
    (["--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", "/nonexistent/tok"],
     "--tokenizer-model /nonexistent/tok: no such file or directory"),
    (["--vocab-file", "README.md"], "--vocab-file needs a --tokenizer-type that reads it"),
])
def test_pretrain_refuses_in_one_line(flags, message):
    with pytest.raises(ConfigError, match=message) as error:
        parse_args(TINY_MODEL + ["--data-path", "p"] + flags, world_size=1)
    assert "\n" not in str(error.value)


def test_files_that_are_not_that_kind_are_one_line(tokenizer_set, tmp_path):
    from mtmegatron.data.resolve import resolve_data

    prefix = tokenizer_set["NullTokenizer"]["prefix"]
    not_a_model = tmp_path / "x.model"
    not_a_model.write_text("not a sentencepiece model")
    args = parse_args(TINY_MODEL + ["--data-path", prefix, "--tokenizer-type", "Llama2Tokenizer",
                                    "--tokenizer-model", str(not_a_model)], world_size=1)
    with pytest.raises(ConfigError, match=f"cannot load --tokenizer-type Llama2Tokenizer from {not_a_model}") as e:
        resolve_data(args, progress=False)
    assert "\n" not in str(e.value)
    tik = tokenizer_set["TikTokenizer"]["flags"]
    args = parse_args(TINY_MODEL + ["--data-path", prefix] + tik[:-1] + ["100000"], world_size=1)
    with pytest.raises(ConfigError, match="--vocab-size \\(100000\\) must be more than --tiktoken-num-special-tokens"):
        resolve_data(args, progress=False)
    args = parse_args(TINY_MODEL[:-2] + ["--vocab-size", "64", "--tokenizer-type", "NullTokenizer"], world_size=1)
    with pytest.raises(ConfigError, match="needs --data-path .* or --mock-data"):
        resolve_data(args, progress=False)


def test_preprocess_refuses_in_one_line(tokenizer_set, tmp_path, capsys):
    source = str(tokenizer_set["root"] / "docs.jsonl")
    base = ["preprocess", "--input", source, "--output-prefix", str(tmp_path / "out")]
    cases = [
        (["--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", str(tmp_path / "missing.json"), "--merge-file",
          "m.txt"], f"--vocab-file {tmp_path / 'missing.json'}: no such file"),
        (["--tokenizer-type", "Unknown"], "argument --tokenizer-type: invalid choice: 'Unknown'"),
        (["--tokenizer-type", "BertWordPieceCase"], "BERT models are not supported; GPT-style only"),
        ([], "name a tokenizer: --tokenizer-type"),
        (["--tokenizer-type", "NullTokenizer", "--vocab-size", "64", "--split-sentences"],
         "--split-sentences is not supported"),
    ]
    for flags, message in cases:
        try:
            status = cli.main(base + flags)
        except SystemExit as e:  # argparse's own errors (one line here too)
            status = e.code
        assert status == 2
        err = capsys.readouterr().err
        assert err.startswith("mtmegatron preprocess: error: ") and message in err and err.count("\n") == 1, err
    assert not list(tmp_path.iterdir())  # nothing written
    # a bad line after good documents: the half-written dataset is removed
    bad = tmp_path.parent / f"{tmp_path.name}-bad.jsonl"
    bad.write_text((tokenizer_set["root"] / "docs.jsonl").read_text() + '{"body": "no text field"}\n')
    assert cli.main(["preprocess", "--input", str(bad), "--output-prefix", str(tmp_path / "out"), "--workers", "2"]
                    + tokenizer_set["GPT2BPETokenizer"]["flags"]) == 2
    assert f"{bad.name}:41: not a JSON object with a 'text' field" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())

