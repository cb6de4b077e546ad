"""Attention / context-parallel flags of ``mtmegatron.pretrain`` and their checks (no megatron import).

``--attention-backend`` takes Megatron-LM's values: ``auto`` (default), ``flash`` and ``fused`` select
mtmegatron's SDPA core attention (torch's dispatcher picks its flash / memory-efficient kernel); ``local`` and
``unfused`` keep megatron-core's ``DotProductAttention`` (explicit ``[b, h, s, s]`` scores, no CP).
``--cp-comm-type p2p|all_gather`` picks ring attention or all-gathered K/V for ``--context-parallel-size > 1``
(Megatron-LM's ``a2a`` variants need TransformerEngine and are not offered).
May assume: argparse namespaces from mtmegatron.config.arguments (parsed, preset filled).
"""

from __future__ import annotations

import argparse

from mtmegatron.attention.spec import CP_COMM_TYPES, LOCAL_BACKENDS
from mtmegatron.utils.errors import ConfigError

SDPA_BACKENDS = ("auto", "flash", "fused")


def add_attention_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("attention and context parallelism")
    g.add_argument("--attention-backend", choices=SDPA_BACKENDS + LOCAL_BACKENDS, default="auto",
                   help="auto/flash/fused: mtmegatron's SDPA core attention; local/unfused: megatron-core's "
                        "DotProductAttention (explicit [b, h, s, s] scores, no context parallelism)")
    g.add_argument("--cp-comm-type", choices=CP_COMM_TYPES, nargs="+", default=["p2p"],
                   help="context parallelism: ring attention (p2p) or all-gathered K/V (all_gather)")


def check_attention_args(args: argparse.Namespace) -> None:
    """Raise ``ConfigError`` for attention/CP flag combinations that cannot work."""
    cp, tp = args.context_parallel_size, args.tensor_model_parallel_size
    if cp == 1:
        return
    if args.attention_backend in LOCAL_BACKENDS:
        raise ConfigError(f"--context-parallel-size {cp} needs mtmegatron's attention: drop --attention-backend "
                          f"{args.attention_backend} (megatron-core's local attention has no context parallelism)")
    if args.seq_length % (2 * cp):
        raise ConfigError(f"--seq-length {args.seq_length} is not divisible by 2 x --context-parallel-size {cp} = "
                          f"{2 * cp} (each CP rank holds two load-balanced chunks of the sequence)")
    if args.sequence_parallel and (args.seq_length // cp) % tp:
        raise ConfigError(f"with --sequence-parallel, the per-CP-rank sequence {args.seq_length // cp} must be "
                          f"divisible by --tensor-model-parallel-size {tp}")
    if args.attention_dropout:
        raise ConfigError("--context-parallel-size > 1 needs --attention-dropout 0 (dropout inside ring attention is "
                          "not implemented)")
