"""One tiny file set per ``--tokenizer-type`` kind, each preprocessed once with ``mtmegatron preprocess`` (the
flags a user passes) for the whole session; the tests only read it."""

from __future__ import annotations

import pytest

from helpers import tokenizer_files as files

NULL_VOCAB = 64
TIKTOKEN_SPECIAL = 16
TIKTOKEN_RANKS = 320


@pytest.fixture(scope="session")
def tokenizer_set(tmp_path_factory):
    """{kind: {"flags": the tokenizer flags, "prefix": the preprocessed dataset}} plus "root" and "docs"."""
    from mtmegatron import cli

    root = tmp_path_factory.mktemp("tokenizer-set")
    docs = files.corpus_documents()
    text = files.write_jsonl(root / "docs.jsonl", docs)
    vocab, merges = files.write_gpt2_files(root / "gpt2", docs)
    tiktoken_file = files.write_tiktoken_json(root / "tiktoken.json", docs, TIKTOKEN_RANKS)
    kinds = {
        "SentencePieceTokenizer": ["--tokenizer-model", str(files.write_sentencepiece(root, docs))],
        "GPT2BPETokenizer": ["--vocab-file", str(vocab), "--merge-file", str(merges)],
        "HuggingFaceTokenizer": ["--tokenizer-model", str(files.write_deepseek_style_hf(root / "deepseek", docs))],
        "TikTokenizer": ["--tokenizer-model", str(tiktoken_file), "--tiktoken-pattern", "v2",
                         "--tiktoken-num-special-tokens", str(TIKTOKEN_SPECIAL),
                         "--vocab-size", str(TIKTOKEN_SPECIAL + TIKTOKEN_RANKS)],
        "NullTokenizer": ["--vocab-size", str(NULL_VOCAB)],
    }
    out = {"root": root, "docs": docs}
    for kind, flags in kinds.items():
        flags = ["--tokenizer-type", kind] + flags
        source = files.write_null_documents(root / "null.jsonl", NULL_VOCAB) if kind == "NullTokenizer" else text
        prefix = root / kind
        assert cli.main(["preprocess", "--input", str(source), "--output-prefix", str(prefix), "--append-eod",
                         "--workers", "2"] + flags) == 0
        out[kind] = {"flags": flags, "prefix": f"{prefix}_text_document"}
    return out
