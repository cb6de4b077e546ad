"""FP8 flags (Megatron-LM spellings): recipe dataclasses built from them, and each user mistake reported as
one ConfigError before any process starts; the FP8 spec swap covers dense and MoE expert linears."""

from __future__ import annotations

import pytest
from helpers.pretrain_runner import TINY

from mtmegatron.fp8 import BlockwiseScaling, DelayedScaling, MXFP8Scaling, recipe_of
from mtmegatron.fp8.section import Fp8
from mtmegatron.config.arguments import parse_args
from mtmegatron.utils.errors import ConfigError

BASE = [a for a in TINY if a != "--mock-data"] + ["--mock-data"]


def parse(*extra):
    return parse_args(BASE + list(extra), world_size=1)


def test_flags_build_recipes():
    args = parse("--fp8-format", "e4m3", "--fp8-margin", "2", "--fp8-amax-history-len", "16",
                 "--fp8-amax-compute-algo", "max")
    recipe = recipe_of(Fp8.of(args))  # --fp8-recipe defaults to delayed, as in Megatron-LM
    assert recipe == DelayedScaling(fp8_format="e4m3", margin=2, amax_history_len=16, amax_compute_algo="max")
    import torch

    assert recipe.bwd_dtype == torch.float8_e4m3fn
    hybrid = recipe_of(Fp8.of(parse("--fp8-format", "hybrid", "--fp8-recipe", "blockwise")))
    assert isinstance(hybrid, BlockwiseScaling) and hybrid.bwd_dtype == torch.float8_e5m2
    assert hybrid.activation_block == (1, 128) and hybrid.weight_block == (128, 128)
    assert isinstance(recipe_of(Fp8.of(parse("--fp8-format", "hybrid", "--fp8-recipe", "mxfp8"))), MXFP8Scaling)
    assert recipe_of(Fp8.of(parse())) is None


@pytest.mark.parametrize("extra, message", [
    (["--fp8-recipe", "blockwise"], "need --fp8-format"),
    (["--fp8-format", "hybrid", "--first-last-layers-bf16"], "not supported with --fp8-recipe delayed"),
    (["--fp8-format", "hybrid", "--fp8-recipe", "mxfp8", "--first-last-layers-bf16",
      "--num-layers-at-start-in-bf16", "5"], "--num-layers-at-start-in-bf16 must be between 0 and the 4"),
    (["--fp8-format", "hybrid", "--fp8-amax-history-len", "0"], "--fp8-amax-history-len must be >= 1"),
    (["--fp8-format", "e4m3", "--fp16"], "needs --bf16"),
])
def test_fp8_flag_mistakes_are_config_errors(extra, message):
    with pytest.raises(ConfigError, match=message):
        parse(*extra)


def test_fp8_linears_reach_dense_and_expert_linears():
    from mtmegatron.fp8.linear import Fp8ColumnParallelLinear, Fp8RowParallelLinear
    from mtmegatron.models.gpt import layer_choice
    from mtmegatron.models.layer_spec import build_layer_spec

    args = parse("--fp8-format", "hybrid", "--fp8-recipe", "tensorwise", "--fp8-executor", "emulated",
                 "--num-experts", "4")
    args.fp8_executor_in_use = "emulated"  # no backend activated in this process
    dense_attn = build_layer_spec(layer_choice(args), "dense").submodules.self_attention.submodules
    assert dense_attn.linear_qkv.module is Fp8ColumnParallelLinear
    assert dense_attn.linear_proj.module is Fp8RowParallelLinear
    experts = build_layer_spec(layer_choice(args), "moe").submodules.mlp.submodules.experts.submodules
    assert experts.linear_fc1.module is Fp8ColumnParallelLinear and experts.linear_fc2.module is Fp8RowParallelLinear
    assert experts.linear_fc1.params["fp8_recipe"].name == "tensorwise"


def test_unavailable_executor_is_one_clear_error(tmp_path):
    from helpers.pretrain_runner import run_pretrain

    proc, _ = run_pretrain(1, BASE + ["--train-iters", "1", "--fp8-format", "hybrid", "--fp8-executor",
                                      "transformer_engine"], tmp_path, expect_ok=False)
    assert proc.returncode == 2
    assert ("mtmegatron.pretrain: error: --fp8-executor transformer_engine is not offered by backend cpu "
            "(offers: scaled_mm, emulated)") in proc.stderr
