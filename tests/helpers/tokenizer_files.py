"""Tiny tokenizer files of every ``--tokenizer-type`` kind, generated at test time from a few KB of the
embedded corpus (nothing binary is committed): a SentencePiece BPE model (sentencepiece's own trainer), a
GPT-2 vocab.json + merges.txt (``tokenizers``' byte-level BPE), an HF tokenizer directory with a
DeepSeek-V3-style tokenizer_config.json (``<｜begin▁of▁sentence｜>`` / ``<｜end▁of▁sentence｜>`` as AddedToken
dicts), and a tiktoken vocabulary in the JSON format megatron-core reads (ranks from tiktoken's own trainer).
"""

from __future__ import annotations

import base64
import json
import lzma
from pathlib import Path

DEEPSEEK_BOS = "<｜begin▁of▁sentence｜>"
DEEPSEEK_EOS = "<｜end▁of▁sentence｜>"
DEEPSEEK_PAD = "<｜▁pad▁｜>"
TIKTOKEN_V2 = ("[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+|"
               "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*|\\p{N}|"
               " ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")


def corpus_documents(num_docs: int = 40, chars: int = 400) -> list[str]:
    """``num_docs`` short documents: verses of the embedded corpus's first chapters."""
    from mtmegatron.data import embedded

    with lzma.open(embedded.corpus_path(), "rt") as f:
        text = " ".join(json.loads(next(f))["text"] for _ in range(3))
    return [text[i * chars:(i + 1) * chars].strip() for i in range(num_docs)]


def write_sentencepiece(directory: Path, docs: list[str], vocab_size: int = 300) -> Path:
    import sentencepiece

    prefix = directory / "sp"
    sentencepiece.SentencePieceTrainer.train(sentence_iterator=iter(docs), model_prefix=str(prefix),
                                             vocab_size=vocab_size, model_type="bpe", minloglevel=2,
                                             num_threads=1)
    return prefix.with_suffix(".model")


def write_gpt2_files(directory: Path, docs: list[str], vocab_size: int = 300) -> tuple[Path, Path]:
    from tokenizers import ByteLevelBPETokenizer

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(docs, vocab_size=vocab_size, special_tokens=["<|endoftext|>"], show_progress=False)
    directory.mkdir(parents=True, exist_ok=True)
    vocab, merges = bpe.save_model(str(directory))
    return Path(vocab), Path(merges)


def write_deepseek_style_hf(directory: Path, docs: list[str], vocab_size: int = 320) -> Path:
    """A byte-level BPE saved as tokenizer.json beside a tokenizer_config.json shaped like DeepSeek-V3's."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[DEEPSEEK_BOS, DEEPSEEK_EOS, DEEPSEEK_PAD],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(docs, trainer=trainer)
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(directory / "tokenizer.json"))

    def added(content):
        return {"__type": "AddedToken", "content": content, "lstrip": False, "normalized": True, "rstrip": False,
                "single_word": False}

    config = {"add_bos_token": True, "add_eos_token": False, "bos_token": added(DEEPSEEK_BOS),
              "clean_up_tokenization_spaces": False, "eos_token": added(DEEPSEEK_EOS), "legacy": True,
              "model_max_length": 16384, "pad_token": added(DEEPSEEK_EOS), "sp_model_kwargs": {},
              "unk_token": None, "tokenizer_class": "LlamaTokenizerFast"}
    (directory / "tokenizer_config.json").write_text(json.dumps(config, ensure_ascii=False, indent=2))
    return directory


def write_tiktoken_json(path: Path, docs: list[str], num_ranks: int = 320) -> Path:
    """``num_ranks`` BPE ranks (256 bytes, then merges) as megatron-core's TikTokenizer reads them."""
    from tiktoken._educational import bpe_train

    ranks = bpe_train("\n".join(docs), num_ranks, TIKTOKEN_V2, visualise=None)
    rows = [{"rank": rank, "token_bytes": base64.b64encode(token).decode(),
             "token_str": token.decode("utf-8", errors="replace")}
            for token, rank in sorted(ranks.items(), key=lambda kv: kv[1])]
    path.write_text(json.dumps(rows))
    return path


def write_null_documents(path: Path, vocab_size: int, num_docs: int = 60) -> Path:
    """JSONL of NullTokenizer text (space-separated ids): short repeating patterns a model can learn."""
    lines = []
    for d in range(num_docs):
        period = 3 + d % 4
        pattern = [(d * 7 + k * 11) % vocab_size for k in range(period)]
        ids = [pattern[i % period] for i in range(48)]
        lines.append(json.dumps({"text": " ".join(map(str, ids))}))
    path.write_text("\n".join(lines) + "\n")
    return path


def write_jsonl(path: Path, docs: list[str]) -> Path:
    path.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    return path
