"""The data flags of a pretrain run are checked before any process group: each mistake is one ConfigError."""

from __future__ import annotations

import json

import pytest

from mtmegatron.data.preprocess import preprocess
from mtmegatron.data.resolve import resolve_data
from mtmegatron.data.tokenizer import train_bpe
from mtmegatron.config.arguments import parse_args
from mtmegatron.utils.errors import ConfigError

SMALL = ["--model", "llama3", "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
         "--max-position-embeddings", "32", "--train-iters", "20"]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("resolve")
    tokenizer = train_bpe([f"document number {i} of a tiny corpus" for i in range(50)], 300, str(root / "tok"))
    src = root / "d.jsonl"
    src.write_text("".join(json.dumps({"text": f"line {i} of text"}) + "\n" for i in range(30)))
    return preprocess([str(src)], str(root / "d"), tokenizer, progress=False), str(root / "tok")


def test_real_data_resolves_with_blend_weights_and_defaults(dataset):
    prefix, tok = dataset
    # a weighted blend asks samples of every split: on 30 documents the default split's 0.1% test share is
    # empty (data/splits.empty_splits), so this blend names a split without a test share
    args = parse_args(SMALL + ["--data-path", "0.3", prefix, "0.7", prefix, "--tokenizer-model", tok,
                               "--vocab-size", "512", "--split", "80,20,0"], world_size=1)
    assert args.eval_interval == 2  # default: train-iters / 10
    tokenizer = resolve_data(args, progress=False)
    assert tokenizer.vocab_size <= 300 and args.data_cache_path.endswith("/cache")


@pytest.mark.parametrize("extra, message", [
    (["--vocab-size", "512"], "--data-path needs --tokenizer-model DIR"),
    (["--vocab-size", "256", "--tokenizer-model", "TOK"], "has 300 tokens, more than the model's --vocab-size 256"),
    (["--vocab-size", "512", "--tokenizer-model", "TOK", "--data-path", "1", "P", "1", "P"],
     "--split 969, 30, 1 gives the test split of .* no sequence"),
    # two prefixes (Megatron-LM's blend format 3, weights from sizes): 'x' is read as a prefix, not a weight
    (["--vocab-size", "512", "--tokenizer-model", "TOK", "--data-path", "x", "P"], "dataset x: missing x.idx"),
])
def test_data_mistakes_are_one_clear_error(dataset, extra, message):
    prefix, tok = dataset
    extra = [tok if a == "TOK" else prefix if a == "P" else a for a in extra]
    if "--data-path" not in extra:
        extra += ["--data-path", prefix]
    args = parse_args(SMALL + extra, world_size=1)
    with pytest.raises(ConfigError, match=message):
        resolve_data(args, progress=False)


@pytest.mark.parametrize("flags, message", [
    (["--mock-data", "--data-path", "p"], "mutually exclusive"),
    (["--mock-data", "--keep-last", "2"], "--keep-last needs a value >= 1 and --save DIR"),
])
def test_flag_conflicts_are_refused(flags, message):
    with pytest.raises(ConfigError, match=message):
        parse_args(SMALL + ["--vocab-size", "512"] + flags, world_size=1)
