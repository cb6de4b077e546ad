"""Megatron-LM's checkpoint flags at parse time (config/checkpoint_flags.py): Megatron-LM's defaults, the
refusals with their reasons, and ``--use-checkpoint-args`` filling the model from the Megatron-LM fixture's
saved Namespace. No process group is started."""

from __future__ import annotations

from pathlib import Path

import pytest

from mtmegatron.config.arguments import parse_args
from mtmegatron.utils.errors import ConfigError

FIXTURE = Path(__file__).parent.parent / "fixtures" / "megatron_lm_ckpt"
BASE = ["--backend", "cpu", "--model", "llama3", "--mock-data"]


def test_megatron_lm_defaults():
    args = parse_args(BASE, world_size=1)
    assert args.ckpt_format == "torch_dist" and args.ckpt_fully_parallel_save is True
    assert args.dist_ckpt_strictness == "assume_ok_unexpected"
    assert args.no_save_optim is None and args.no_save_rng is None and not args.async_save
    assert not (args.ckpt_fully_parallel_load or args.ckpt_assume_constant_structure or args.use_checkpoint_args)
    assert parse_args(BASE + ["--no-ckpt-fully-parallel-save"], world_size=1).ckpt_fully_parallel_save is False


@pytest.mark.parametrize("flags, message", [
    (["--ckpt-format", "torch"], "--ckpt-format torch: the legacy per-rank torch.save format"),
    (["--ckpt-format", "torch_dcp"], "--ckpt-format torch_dcp: plain torch.distributed.checkpoint"),
    (["--ckpt-format", "fsdp_dtensor"], "--ckpt-format fsdp_dtensor: Megatron FSDP's DTensor format"),
    (["--async-save"], "--async-save: not supported"),
    (["--non-persistent-save-interval", "10"], "--non-persistent-save-interval needs --non-persistent-ckpt-type global"),
    (["--non-persistent-ckpt-type", "local"], "--non-persistent-ckpt-type local: nvidia-resiliency-ext's local"),
    (["--non-persistent-ckpt-type", "in_memory"], "--non-persistent-ckpt-type in_memory: not supported by Megatron-LM"),
    (["--non-persistent-local-ckpt-algo", "atomic"], "--non-persistent-local-ckpt-algo: only for"),
    (["--use-checkpoint-args"], "--use-checkpoint-args needs --load DIR"),
])
def test_refusals_name_the_flag_and_why(flags, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_args(BASE + flags, world_size=1)


def test_use_checkpoint_args_takes_the_model_from_megatron_lm_namespace():
    args = parse_args(BASE + ["--load", str(FIXTURE), "--use-checkpoint-args"], world_size=1)
    assert (args.num_layers, args.hidden_size, args.ffn_hidden_size, args.num_attention_heads) == (2, 64, 128, 4)
    assert args.group_query_attention and args.num_query_groups == 2 and args.kv_channels == 16
    assert args.normalization == "RMSNorm" and args.swiglu and args.untie_embeddings_and_output_weights
    assert args.position_embedding_type == "rope" and args.rotary_base == 10000 and not args.add_bias_linear
    assert args.seq_length == 32 and args.max_position_embeddings == 32
    assert args.vocab_size == 128 and args.padded_vocab_size == 128  # its padded vocabulary: the model's rows
    assert "rotary_base=10000" in args.checkpoint_args_applied  # the llama3 preset's 500000 was replaced
    # Megatron-LM's rule: a flag on the command line wins over the checkpoint for the fields it does not force
    given = parse_args(BASE + ["--load", str(FIXTURE), "--use-checkpoint-args", "--num-layers", "4"], world_size=1)
    assert given.num_layers == 4 and given.hidden_size == 64


def test_use_checkpoint_args_without_a_saved_namespace_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match="no complete checkpoint under --load"):
        parse_args(BASE + ["--load", str(tmp_path), "--use-checkpoint-args"], world_size=1)


# Megatron-LM's defaults for a GPT-2-style model (LayerNorm, GeLU, learned positions, linear biases, tied
# embeddings, no GQA) as its validate_args leaves them in the saved Namespace: add_qkv_bias switched on by
# add_bias_linear, num_query_groups its parser default 1 (ignored without --group-query-attention), kv_channels
# and ffn_hidden_size derived
GPT2_NAMESPACE = dict(normalization="LayerNorm", position_embedding_type="learned_absolute", add_bias_linear=True,
                      add_qkv_bias=True, swiglu=False, untie_embeddings_and_output_weights=False,
                      group_query_attention=False, num_query_groups=1, kv_channels=16, ffn_hidden_size=256)
GPT2_FLAGS = ["--backend", "cpu", "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
              "--seq-length", "32", "--max-position-embeddings", "32", "--vocab-size", "128", "--mock-data",
              "--micro-batch-size", "2", "--train-iters", "1", "--lr", "1e-4"]


def _megatron_lm_common(**fields) -> dict:
    import copy

    import torch

    common = torch.load(FIXTURE / "iter_0000003" / "common.pt", weights_only=False)
    common["args"] = copy.copy(common["args"])
    vars(common["args"]).update(fields)
    return common


@pytest.mark.parametrize("ckpt_fields, flags, found", [
    ({}, [], {}),  # Megatron-LM's defaults on both sides
    ({}, ["--ffn-hidden-size", "256", "--kv-channels", "16"], {}),  # the derived values given explicitly
    ({"num_query_groups": 4, "group_query_attention": True}, [], {}),  # GQA with as many groups as heads
    ({}, ["--ffn-hidden-size", "128"], {"ffn_hidden_size": (256, 128)}),
    ({}, ["--normalization", "RMSNorm"], {"normalization": ("LayerNorm", "RMSNorm")}),
    ({"add_bias_linear": False}, ["--disable-bias-linear"], {"add_qkv_bias": (True, False)}),  # Qwen2-style vs none
    ({"rotary_base": 500000}, [], {}),  # learned positions: the RoPE base is unused
])
def test_megatron_lm_checkpoint_compared_after_megatron_lm_derivations(ckpt_fields, flags, found):
    from mtmegatron.models.fingerprint import describe_mismatches, mismatches
    from mtmegatron.training.checkpoint.megatron_lm_checkpoint import recorded_fingerprint

    common = _megatron_lm_common(**{**GPT2_NAMESPACE, **ckpt_fields})
    args = parse_args(GPT2_FLAGS + flags, world_size=1)
    got = mismatches(recorded_fingerprint(common), args)
    assert got == found
    if found:  # one line naming the field and both values
        field, (ckpt, run) = next(iter(found.items()))
        assert f"{field}: checkpoint {ckpt} vs run {run}" == describe_mismatches(got)
