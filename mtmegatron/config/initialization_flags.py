"""Initialization flags of ``mtmegatron.pretrain`` with Megatron-LM's meaning: ``--use-cpu-initialization`` (every
full weight built on the host, so the weights do not depend on the tensor-parallel size) and
``--data-parallel-random-init`` (each data-parallel rank seeded differently). What they do is
models/initialization.py's.
May assume: argparse only.
"""

from __future__ import annotations

import argparse


def add_initialization_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("initialization (mtmegatron/models/initialization.py)")
    group.add_argument("--use-cpu-initialization", action="store_true", default=None, dest="use_cpu_initialization",
                       help="build every full weight on the host and keep this rank's shard: the same weights "
                            "under every tensor-parallel size (default: born on the device, as Megatron-LM; the "
                            "cpu backend always builds on the host)")
    group.add_argument("--data-parallel-random-init", action="store_true", default=False,
                       dest="data_parallel_random_init",
                       help="seed each data-parallel rank differently (seed + 10 * DP rank), as Megatron-LM")
