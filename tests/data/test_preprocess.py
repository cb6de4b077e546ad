"""`mtmegatron preprocess`: JSONL and plain text -> megatron-core indexed datasets that read back to the same
text; the offline BPE; the shipped corpus; and one clear error for missing, truncated or corrupt files."""

from __future__ import annotations

import json
import lzma

import pytest

from mtmegatron import cli
from mtmegatron.data import embedded
from mtmegatron.data.indexed import DataError, check_indexed_dataset
from mtmegatron.data.tokenizer import EOD, TokenizerError, load_tokenizer, train_bpe

DOCS = ["The quick brown fox jumps over the lazy dog.", "Ünïcödé and emoji 🙂 survive byte-level BPE.",
        "Three lines,\nwith newlines,\nkept as they are."] * 20


def _read_back(prefix: str, tokenizer) -> list[str]:
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    dataset = IndexedDataset(prefix)
    out = []
    for i in range(len(dataset)):
        ids = dataset[i].tolist()
        assert ids[-1] == tokenizer.eod  # every document ends with <|endoftext|>
        out.append(tokenizer.detokenize(ids[:-1]))
    return out


def test_jsonl_with_trained_bpe_reads_back_exactly(tmp_path, capsys):
    src = tmp_path / "docs.jsonl"
    src.write_text("".join(json.dumps({"body": d}) + "\n" for d in DOCS))
    rc = cli.main(["preprocess", "--input", str(src), "--output-prefix", str(tmp_path / "out"),
                   "--json-keys", "body", "--train-tokenizer", "300", "--workers", "2", "--append-eod"])
    assert rc == 0
    prefix = str(tmp_path / "out_body_document")
    assert f"--data-path {prefix}" in capsys.readouterr().out
    tokenizer = load_tokenizer(str(tmp_path / "out_tokenizer"))
    assert tokenizer.vocab_size <= 300 and tokenizer.tokenizer.id_to_token(tokenizer.eod) == EOD
    assert _read_back(prefix, tokenizer) == DOCS
    stats = check_indexed_dataset(prefix)
    assert stats["documents"] == len(DOCS)
    assert not list(tmp_path.glob("*.tmp*"))  # written under temporary names, then renamed


def test_plain_text_paragraphs_with_a_local_tokenizer(tmp_path):
    tokenizer = train_bpe(DOCS, 280, str(tmp_path / "tok"))
    src = tmp_path / "book.txt.xz"
    with lzma.open(src, "wt") as f:
        f.write("First paragraph,\nstill first.\n\n\nSecond one.\n")
    assert cli.main(["preprocess", "--input", str(src), "--output-prefix", str(tmp_path / "b"),
                     "--tokenizer-model", str(tmp_path / "tok"), "--workers", "1", "--append-eod"]) == 0
    assert _read_back(str(tmp_path / "b_text_document"), tokenizer) == ["First paragraph,\nstill first.",
                                                                        "Second one."]


def test_bad_inputs_are_one_clear_error(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok"}\n{"other": 1}\n')
    assert cli.main(["preprocess", "--input", str(bad), "--output-prefix", str(tmp_path / "x"),
                     "--train-tokenizer", "300", "--workers", "1"]) == 2
    assert "bad.jsonl:2: not a JSON object with a 'text' field" in capsys.readouterr().err
    with pytest.raises(TokenizerError, match="at least 258"):
        train_bpe(DOCS, 100, str(tmp_path / "small"))
    with pytest.raises(TokenizerError, match="no tokenizer at"):
        load_tokenizer(str(tmp_path / "nowhere"))


def test_missing_truncated_and_corrupt_datasets(tmp_path):
    tokenizer = train_bpe(DOCS, 280, str(tmp_path / "tok"))
    from mtmegatron.data.preprocess import preprocess

    src = tmp_path / "d.jsonl"
    src.write_text("".join(json.dumps({"text": d}) + "\n" for d in DOCS))
    prefix = preprocess([str(src)], str(tmp_path / "d"), tokenizer, progress=False)
    check_indexed_dataset(prefix)
    with pytest.raises(DataError, match="missing .*nope.idx and .*nope.bin"):
        check_indexed_dataset(str(tmp_path / "nope"))
    data = (tmp_path / "d_text_document.bin").read_bytes()
    (tmp_path / "d_text_document.bin").write_bytes(data[:-6])
    with pytest.raises(DataError, match="does not match its index"):
        check_indexed_dataset(prefix)
    (tmp_path / "d_text_document.bin").write_bytes(data)
    index = (tmp_path / "d_text_document.idx").read_bytes()
    (tmp_path / "d_text_document.idx").write_bytes(b"garbage!!" + index[9:])
    with pytest.raises(DataError, match="bad header"):
        check_indexed_dataset(prefix)
    (tmp_path / "d_text_document.idx").write_bytes(index[:40])
    with pytest.raises(DataError, match="truncated"):
        check_indexed_dataset(prefix)


def test_embedded_corpus_is_shipped_with_its_notice():
    with lzma.open(embedded.corpus_path(), "rt") as f:
        docs = [json.loads(line) for line in f]
    assert len(docs) == 1189  # one document per chapter of the King James Version
    assert docs[0]["text"].startswith("In the beginning God created the heaven and the earth.")
    assert sum(len(d["text"]) for d in docs) > 4_000_000
    notice = (embedded.corpus_path().rsplit("/", 1)[0] + "/NOTICE.md")
    assert "public domain" in open(notice).read()
