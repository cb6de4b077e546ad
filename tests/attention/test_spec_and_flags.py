"""The spec hook (layer spec, MLA layer spec, decoder block spec, TE left alone) and the attention/CP flag checks.

In-process and cheap: specs are edited, not built; flags go through ``parse_args`` with an explicit world size.
"""

from __future__ import annotations

import argparse

import pytest
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.transformer.dot_product_attention import DotProductAttention

from mtmegatron.attention.core import SDPADotProductAttention
from mtmegatron.attention.spec import apply_attention_to_spec
from mtmegatron.models.fused_spec import FusedDotProductAttention, get_gpt_layer_fused_spec
from mtmegatron.training.arguments import ConfigError, parse_args

AUTO, LOCAL = argparse.Namespace(attention_backend="auto"), argparse.Namespace(attention_backend="local")


def _core(layer_spec):
    return layer_spec.submodules.self_attention.submodules.core_attention


@pytest.mark.parametrize("make", [
    lambda: get_gpt_layer_local_spec(),
    lambda: get_gpt_layer_local_spec(multi_latent_attention=True),
    lambda: get_gpt_layer_fused_spec(),
], ids=["local", "local_mla", "mtmegatron_fused"])
def test_layer_spec_gets_sdpa_attention(make):
    assert _core(apply_attention_to_spec(make(), AUTO)) is SDPADotProductAttention


def test_local_backend_keeps_the_spec():
    assert _core(apply_attention_to_spec(get_gpt_layer_local_spec(), LOCAL)) is DotProductAttention
    assert _core(apply_attention_to_spec(get_gpt_layer_fused_spec(), LOCAL)) is FusedDotProductAttention


def test_block_spec_every_layer_gets_sdpa_attention():
    """A decoder block spec (what get_gpt_decoder_block_spec returns): dense and MoE layers, one MLA."""
    from megatron.core.transformer.transformer_block import TransformerBlockSubmodules

    block = TransformerBlockSubmodules(layer_specs=[
        get_gpt_layer_local_spec(), get_gpt_layer_local_spec(num_experts=2),
        get_gpt_layer_local_spec(multi_latent_attention=True)])
    apply_attention_to_spec(block, AUTO)
    assert all(_core(layer) is SDPADotProductAttention for layer in block.layer_specs)


def test_a_transformer_engine_attention_is_left_alone():
    class TEDotProductAttention:  # stands in for TE's class: not a megatron DotProductAttention
        pass

    spec = get_gpt_layer_local_spec()
    spec.submodules.self_attention.submodules.core_attention = TEDotProductAttention
    assert _core(apply_attention_to_spec(spec, AUTO)) is TEDotProductAttention


TINY = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "64",
        "--vocab-size", "128", "--mock-data", "--micro-batch-size", "1", "--global-batch-size", "2"]


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
