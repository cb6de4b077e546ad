"""``--padded-vocab-size`` (Megatron-LM's): the embedding's rows as given instead of the vocabulary padded to
``--make-vocab-size-divisible-by``; refused below the vocabulary or where TP does not divide it. In-process
parsing only (the converted-checkpoint run is tests/convert/test_hf_families.py)."""

from __future__ import annotations

import pytest

from helpers.pretrain_runner import TINY
from mtmegatron.config.arguments import parse_args
from mtmegatron.utils.errors import ConfigError

BASE = TINY + ["--train-iters", "1", "--vocab-size", "100"]


@pytest.mark.parametrize("extra, rows", [([], 128), (["--padded-vocab-size", "160"], 160),
                                         (["--padded-vocab-size", "100"], 100)])
def test_rows_as_given_else_padded(extra, rows):
    args = parse_args(BASE + extra, world_size=1)
    assert (args.vocab_size, args.padded_vocab_size) == (100, rows)


@pytest.mark.parametrize("extra, world", [(["--padded-vocab-size", "64"], 1),
                                          (["--padded-vocab-size", "101", "--tensor-model-parallel-size", "2"], 2)])
def test_refused_below_the_vocabulary_or_not_divided_by_tp(extra, world):
    with pytest.raises(ConfigError, match="--padded-vocab-size .* must be at least the vocabulary \\(100\\) and "
                                          "divisible by --tensor-model-parallel-size"):
        parse_args(BASE + extra, world_size=world)
