"""The attention/CP flag checks (which core attention a layer gets: tests/models/test_layer_spec.py).

In-process and cheap: flags go through ``parse_args`` with an explicit world size.
"""

from __future__ import annotations

import pytest

from mtmegatron.config.arguments import parse_args
from mtmegatron.utils.errors import ConfigError

TINY = ["--model", "llama3", "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
        "--seq-length", "64", "--vocab-size", "128", "--mock-data", "--micro-batch-size", "1", "--global-batch-size", "2"]


@pytest.mark.parametrize("extra,world,message", [
    (["--context-parallel-size", "2", "--seq-length", "66"], 2,
     "--seq-length 66 is not divisible by 2 x --context-parallel-size 2 = 4"),
    (["--context-parallel-size", "2", "--attention-backend", "local"], 2, "needs mtmegatron's attention"),
    (["--context-parallel-size", "2", "--attention-dropout", "0.1"], 2, "needs --attention-dropout 0"),
    (["--context-parallel-size", "2", "--tensor-model-parallel-size", "4", "--sequence-parallel",
      "--seq-length", "36", "--max-position-embeddings", "36"], 8, "per-CP-rank sequence 18 must be divisible"),
    (["--context-parallel-size", "2"], 3, "world size 3 is not divisible by TP 1 x PP 1 x CP 2"),
], ids=["seq_not_divisible", "local_backend", "dropout", "sp_split", "world_size"])
def test_bad_cp_flags_are_clear_errors(extra, world, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_args(TINY + extra, world_size=world)


def test_cp_layout_derives_data_parallel_size():
    args = parse_args(TINY + ["--context-parallel-size", "2", "--cp-comm-type", "all_gather",
                              "--global-batch-size", "4"], world_size=8)
    assert args.data_parallel_size == 4 and args.cp_comm_type == "all_gather" and args.attention_backend == "auto"
