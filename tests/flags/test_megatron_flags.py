"""Megatron-LM's whole flag set: every option string recognised, defaults equal to Megatron-LM's, no preset value
reaching a Megatron-LM command line, the demo unchanged, refusals one line naming the flag and why."""

from __future__ import annotations

import csv
import dataclasses
import os
from pathlib import Path

import pytest
import torch

from mtmegatron.config import megatron_flags
from mtmegatron.config.arguments import build_parser, parse_args
from mtmegatron.utils.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
SHARED_TABLE = Path(os.environ.get("MTMEGATRON_SHARED_DIR", REPO.parent / "shared")) / "megatron-lm-0.16.1-flags.tsv"

# A Llama-2-style multi-head Megatron-LM command line without any preset
MEGATRON_GPT = ["--backend", "cpu", "--num-layers", "4", "--hidden-size", "128", "--num-attention-heads", "8",
                "--seq-length", "64", "--max-position-embeddings", "64", "--micro-batch-size", "2",
                "--global-batch-size", "8", "--train-iters", "10", "--lr", "1e-4", "--vocab-size", "512",
                "--mock-data"]


@pytest.fixture(scope="module")
def parser():
    return build_parser()


def test_packaged_table_is_the_shared_one():
    if not SHARED_TABLE.exists():
        pytest.skip(f"the shared flag table is not beside this checkout ({SHARED_TABLE})")
    with open(SHARED_TABLE, newline="") as f:
        shared = [tuple(row.values()) for row in csv.DictReader(f, delimiter="\t")]
    packaged = [(r.flag, r.dest, r.action, r.default, r.choices, r.type) for r in megatron_flags.table()]
    assert packaged == shared
    assert len(packaged) == 681


def _sample_argv(row, action) -> list[str]:
    if row.action in ("StoreTrueAction", "StoreFalseAction", "BooleanOptionalAction"):
        return [row.flag]
    if action.choices:  # a module's narrower choice list (others are refused by argparse, naming the flag)
        value = str(list(action.choices)[0])
    elif row.choices:
        value = row.choices.split(",")[0].split(".")[-1]  # enum members: AttnBackend.flash -> flash
    else:
        value = {"int": "3", "float": "0.5", "tuple_type": "4,0", "moe_freq_type": "2", "no_rope_freq_type": "2",
                 "la_freq_type": "2"}.get(row.type, "x")  # Megatron-LM's converters (config/megatron_lm_types.py)
    count = int(row.nargs) if row.nargs.isdigit() else 1
    return [row.flag, *[value] * count]


def test_every_option_string_is_recognised_and_classified(parser):
    kinds = {}
    for row in megatron_flags.table():
        if row.action == "HelpAction":
            continue
        assert row.flag in parser._option_string_actions, f"{row.flag} is unknown"
        parser.parse_args(MEGATRON_GPT + _sample_argv(row, parser._option_string_actions[row.flag]))  # argparse accepts it (raises ConfigError otherwise)
        kind = megatron_flags.classify(row, parser.hand_registered)
        kinds[row.flag] = kind
        if kind == "refused":
            assert megatron_flags.refusal_reason(row)
    counts = {k: list(kinds.values()).count(k) for k in ("honoured", "config", "noop", "refused")}
    assert sum(counts.values()) == 680 and counts["honoured"] >= 120 and counts["config"] >= 100, counts


def test_defaults_are_megatron_lms(parser):
    args = parser.parse_args([])
    seen = set()
    for row in megatron_flags.table():
        if row.action == "HelpAction" or row.dest in seen:
            continue  # a dest two flags share starts at its first flag's default, in Megatron-LM's parser too
        seen.add(row.dest)
        assert getattr(args, row.dest) == row.default_value, f"{row.flag}: {getattr(args, row.dest)!r}"


# (a refused flag with a non-default value is one line naming it: every refused flag, tests/flags/test_flag_effects.py)


@pytest.mark.parametrize("extra, says", [
    # found by trying flags with non-default values: each was a traceback (or a hang) before issue 35
    (["--window-size", "4,x"], "argument --window-size: invalid tuple_type value: '4,x'"),
    (["--no-rope-freq", "3"], "--no-rope-freq 3: megatron-core's TransformerConfig refuses it: no_rope_freq=3 should be"),
    (["--no-rope-freq", "__import__"], "argument --no-rope-freq: invalid freq_type value"),
    (["--moe-latent-size", "64", "--num-experts", "4"], "--moe-latent-size: MoE latent projections are "
                                                        "TransformerEngine linears"),
    (["--batch-invariant-mode"], "--batch-invariant-mode: megatron-core's TransformerConfig refuses it: Batch "
                                 "invariant mode only supports FlashAttention"),
    (["--main-params-dtype", "fp16"], "--main-params-dtype fp16: megatron-core's OptimizerConfig refuses it"),
    (["--moe-apply-probs-on-input", "--num-experts", "4", "--moe-router-topk", "2"],
     "--moe-apply-probs-on-input: works only with --moe-router-topk 1"),
    (["--moe-shared-expert-intermediate-size", "128", "--num-experts", "4"],
     "--moe-shared-expert-intermediate-size: shared experts take no linear biases"),
])
def test_megatron_core_requirements_are_one_line(extra, says):
    """megatron-core's and TE's assertions as one ConfigError line naming the flag, before any process group (the
    config part as pretrain.prepare checks it, after activation)."""
    import mtmegatron
    from mtmegatron.backends import select_backend
    from mtmegatron.config.megatron_core_checks import check_configs

    mtmegatron.activate(select_backend("cpu"))
    with pytest.raises(ConfigError) as e:
        check_configs(parse_args(MEGATRON_GPT + extra, world_size=1))
    assert str(e.value).startswith(says) and "\n" not in str(e.value), str(e.value)


def test_megatron_lm_value_types():
    """Megatron-LM's tuple_type / no_rope_freq_type: the config gets what Megatron-LM's would."""
    args = parse_args(MEGATRON_GPT + ["--no-rope-freq", "([0]*3+[1])"], world_size=1)
    assert args.no_rope_freq == [0, 0, 0, 1]
    assert parse_args(MEGATRON_GPT + ["--no-rope-freq", "2"], world_size=1).no_rope_freq == 2
    from mtmegatron.config.megatron_lm_types import tuple_type

    assert tuple_type("(4,0)") == tuple_type("4,0") == (4, 0)


def test_flags_command_looks_up_and_helps(capsys):
    """``mtmegatron flags --flag X`` (as docs/flags.md and the README give it) and ``--help``."""
    from mtmegatron.cli import main

    assert main(["flags", "--flag", "--window-size", "--flag", "lr", "--flag=--apply-residual-connection-post-"
                 "layernorm", "--tp-comm-overlap"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines == [
        "--window-size: copied into a megatron-core config by name",
        "--lr: honoured (read by mtmegatron)",
        "--apply-residual-connection-post-layernorm: accepted, no effect (as in Megatron-LM 0.16) — "
        + megatron_flags.NOOP["apply_residual_connection_post_layernorm"],
        "--tp-comm-overlap: refused unless at its default — needs TransformerEngine, which this backend does not have "
        "(userbuffers)"]
    assert main(["flags", "--help"]) == 0
    assert capsys.readouterr().out.startswith("usage: mtmegatron flags [--flag FLAG ...]")


@pytest.mark.parametrize("dest, extra, says", [
    ("moe_aux_loss_coeff", ["--num-experts", "4", "--moe-aux-loss-coeff", "0.01", "0.02"], "several values"),
    ("moe_router_load_balancing_type", ["--num-experts", "4", "--moe-router-load-balancing-type", "aux_loss",
                                        "seq_aux_loss"], "several values"),
    ("cp_comm_type", ["--cp-comm-type", "p2p", "all_gather"], "one value for all layers"),
    ("fp16", ["--fp16", "--use-distributed-optimizer"], "fp16 with the distributed optimizer"),
    ("fp16", ["--fp16", "--fp8-format", "hybrid"], "FP8 training needs --bf16"),
    ("add_position_embedding", ["--no-position-embedding", "--position-embedding-type", "learned_absolute"],
     "--no-position-embedding is deprecated"),
    ("rerun_mode", ["--rerun-mode", "report_stats"], "megatron-core 0.16.1 cannot run it"),
    ("non_persistent_ckpt_type", ["--non-persistent-ckpt-type", "local"], "nvidia-resiliency-ext"),
    ("dataloader_type", ["--dataloader-type", "cyclic"], "per-epoch shuffle is not built"),
    ("dataloader_type", ["--dataloader-type", "external"], "no hook for a user's dataloader"),
    ("fine_grained_activation_offloading", ["--fine-grained-activation-offloading"], "needs --offload-modules"),
    ("cpu_offloading_num_layers", ["--cpu-offloading-num-layers", "4"], "offloads 1 to num-layers - 1 layers"),
])
def test_partly_refused_flags_are_reported_and_really_refused(parser, dest, extra, says):
    """``mtmegatron flags`` says "some values refused" for exactly what validation refuses (one line each)."""
    from mtmegatron.config.flag_report import describe

    assert set(megatron_flags.PARTLY_REFUSED) == {"moe_aux_loss_coeff", "moe_router_load_balancing_type",
                                                 "cp_comm_type", "fp16", "add_position_embedding",
                                                 "rerun_mode", "non_persistent_ckpt_type", "dataloader_type",
                                                 "fine_grained_activation_offloading", "cpu_offloading_num_layers"}
    row = next(r for r in megatron_flags.table() if r.dest == dest and r.action != "HelpAction")
    assert megatron_flags.classify(row, parser.hand_registered) == "honoured"
    assert "some values refused: " + megatron_flags.PARTLY_REFUSED[dest] in describe(row, parser.hand_registered)
    with pytest.raises(ConfigError) as e:
        parse_args(MEGATRON_GPT + extra, world_size=1)
    assert says in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_refused_flag_at_its_default_is_accepted():
    args = parse_args(MEGATRON_GPT + ["--distributed-backend", "nccl", "--use-mcore-models"], world_size=1)
    assert args.num_layers == 4


def test_megatron_command_line_gets_megatron_defaults_not_a_preset():
    import mtmegatron
    from mtmegatron.backends import select_backend

    mtmegatron.activate(select_backend("cpu"))
    from megatron.core.transformer import TransformerConfig

    from mtmegatron.models.gpt import gpt_model_kwargs, transformer_config
    from mtmegatron.training.optimizer import optimizer_config

    args = parse_args(MEGATRON_GPT, world_size=1)
    assert args.model == "gpt" and args.preset_name is None
    config = transformer_config(args)
    rows = {row.dest: row.default_value for row in megatron_flags.table()}
    given = {"num_layers": 4, "hidden_size": 128, "num_attention_heads": 8}
    fp8 = {"fp8", "fp8_recipe", "fp8_margin", "fp8_amax_history_len", "fp8_amax_compute_algo", "tp_only_amax_red",
           "first_last_layers_bf16", "num_layers_at_start_in_bf16", "num_layers_at_end_in_bf16", "fp8_param"}
    # fields computed by mtmegatron for this backend (fusions without kernels here, host init, attention enum)
    ours = {"bias_dropout_fusion", "masked_softmax_fusion", "gradient_accumulation_fusion", "apply_rope_fusion",
            "use_cpu_initialization", "attention_backend", "transformer_impl", "cross_entropy_loss_fusion",
            "moe_grouped_gemm", "batch_p2p_comm", "num_query_groups", "kv_channels", "cuda_graph_scope",
            "layernorm_epsilon", "add_bias_linear", "pipeline_model_parallel_size", "overlap_p2p_comm",
            "persist_layer_norm", "bias_activation_fusion"}
    # what Megatron-LM builds: every field with a flag from the flag or the table's default, megatron-core's own
    # derivations (__post_init__) on top; mtmegatron's per-backend fields taken as they are
    expected = {f.name: given.get(f.name, rows[f.name]) for f in dataclasses.fields(TransformerConfig)
                if f.init and f.name in rows and f.name not in ours and f.name not in fp8}
    expected.update({name: getattr(config, name) for name in ours},
                    ffn_hidden_size=4 * 128, num_moe_experts=None, params_dtype=torch.float32,
                    pipeline_dtype=torch.float32, deallocate_pipeline_outputs=True,  # Megatron-LM's renames
                    cp_comm_type="p2p")  # Megatron-LM: a one-element list becomes its value
    reference = TransformerConfig(**expected)
    checked = 0
    for field in dataclasses.fields(TransformerConfig):
        if callable(getattr(reference, field.name)):
            continue  # init methods / activation: compared below by what they are
        assert getattr(config, field.name) == getattr(reference, field.name), field.name
        checked += field.name in rows and field.name not in ours
    assert checked > 60
    assert config.activation_func.__name__ == "gelu" and config.init_method.keywords["std"] == 0.02
    # the values the tiny preset would have put here
    assert (config.ffn_hidden_size, config.num_query_groups, config.normalization, config.gated_linear_unit) == \
        (512, 8, "LayerNorm", False)
    assert (config.hidden_dropout, config.attention_dropout, config.add_bias_linear) == (0.1, 0.1, True)
    assert gpt_model_kwargs(args)["position_embedding_type"] == "learned_absolute"
    assert gpt_model_kwargs(args)["rotary_base"] == 10000
    opt = optimizer_config(args, config.params_dtype)
    assert (opt.adam_beta2, opt.weight_decay, opt.clip_grad, opt.lr) == (0.999, 0.01, 1.0, 1e-4)
    assert args.lr_decay_style == "linear" and args.padded_vocab_size == 512
    assert "--num-layers 4 (flag)" in args.megatron_differences
    assert not any("preset" in line for line in args.megatron_differences)


def test_named_size_without_shape_flags_uses_the_preset():
    args = parse_args(["--backend", "cpu", "--model", "mixtral", "--mock-data", "--hidden-dropout", "0.2"], world_size=1)
    assert (args.num_experts, args.hidden_dropout, args.adam_beta2) == (4, 0.2, 0.95)
    assert args.value_sources["num_experts"] == "preset mixtral/tiny"
    assert args.value_sources["hidden_dropout"] == "flag --hidden-dropout"


def test_demo_is_unchanged():
    args = parse_args([], world_size=2)
    assert (args.model, args.model_size, args.preset_name) == ("llama3", "tiny", ("llama3", "tiny"))
    shape = (args.num_layers, args.hidden_size, args.ffn_hidden_size, args.num_attention_heads, args.num_query_groups,
             args.seq_length, args.vocab_size, args.normalization, args.swiglu, args.rotary_base)
    assert shape == (4, 128, 352, 8, 4, 128, 1024, "RMSNorm", True, 500000)
    recipe = (args.train_iters, args.lr, args.lr_decay_style, args.adam_beta2, args.micro_batch_size,
              args.global_batch_size, args.hidden_dropout, args.attention_dropout, args.eval_iters, args.log_interval)
    assert recipe == (1000, 1e-3, "cosine", 0.95, 2, 8, 0.0, 0.0, 4, 1)
    assert args.transformer_impl == "local" and _te_missing() in args.impl_note
    # run flags alone keep the demo; one model-shape flag makes it a Megatron-LM command line
    assert parse_args(["--mock-data", "--train-iters", "3"], world_size=2).preset_name == ("llama3", "tiny")
    with pytest.raises(ConfigError, match="--num-layers is required"):
        parse_args(["--hidden-size", "64"], world_size=2)


def _te_missing() -> str:
    """Why TE layers do not serve the auto-selected backend here (cpu in CI: none exist for it)."""
    from mtmegatron.backends import select_backend

    return select_backend(None, warn=False).transformer_engine_missing()


def test_explicit_transformer_engine_without_te_is_refused():
    with pytest.raises(ConfigError) as raised:
        parse_args(MEGATRON_GPT + ["--transformer-impl", "transformer_engine"], world_size=1)
    assert str(raised.value).startswith(f"--transformer-impl transformer_engine: {_te_missing()}")


def test_derived_values_follow_megatron_lm():
    args = parse_args(MEGATRON_GPT + ["--swiglu", "--group-query-attention", "--num-query-groups", "2", "--bf16",
                                      "--recompute-activations", "--num-virtual-stages-per-pipeline-rank", "2",
                                      "--pipeline-model-parallel-size", "2"], world_size=2)
    assert args.ffn_hidden_size == int((4 * 128 * 2 / 3) / 64) * 64  # 320
    assert args.num_query_groups == 2 and args.kv_channels == 16
    assert args.accumulate_allreduce_grads_in_fp32 and args.recompute_granularity == "selective"
    assert args.num_layers_per_virtual_pipeline_stage == 1 and args.virtual_pipeline_model_parallel_size == 2
    args = parse_args(MEGATRON_GPT + ["--bf16", "--grad-reduce-in-bf16"], world_size=1)
    assert not args.accumulate_allreduce_grads_in_fp32
    with pytest.raises(ConfigError, match="--no-position-embedding is deprecated"):
        parse_args(MEGATRON_GPT + ["--no-position-embedding"], world_size=1)
    assert parse_args(MEGATRON_GPT + ["--no-position-embedding", "--position-embedding-type", "rope"],
                      world_size=1).position_embedding_type == "rope"


def test_uneven_pipeline_flags_reach_the_config():
    import mtmegatron
    from mtmegatron.backends import select_backend

    mtmegatron.activate(select_backend("cpu"))
    from mtmegatron.models.gpt import transformer_config

    pp2 = ["--pipeline-model-parallel-size", "2"]
    config = transformer_config(parse_args(MEGATRON_GPT + pp2 + ["--decoder-first-pipeline-num-layers", "1"],
                                           world_size=2))
    assert (config.num_layers_in_first_pipeline_stage, config.num_layers_in_last_pipeline_stage) == (1, None)
    config = transformer_config(parse_args(MEGATRON_GPT + pp2 + ["--account-for-embedding-in-pipeline-split",
                                                                 "--account-for-loss-in-pipeline-split"], world_size=2))
    assert config.account_for_embedding_in_pipeline_split and config.account_for_loss_in_pipeline_split
    for bad, message in ((["--decoder-first-pipeline-num-layers", "4"], "must split evenly"),
                         (["--account-for-loss-in-pipeline-split"], "does not divide --num-layers 4 (+1")):
        with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace("+", r"\+")):
            parse_args(MEGATRON_GPT + pp2 + bad, world_size=2)


def test_values_megatron_lm_requires_are_required():
    def without(flag):
        i = MEGATRON_GPT.index(flag)
        return MEGATRON_GPT[:i] + MEGATRON_GPT[i + 2:]

    with pytest.raises(ConfigError, match="--lr is required"):
        parse_args(without("--lr"), world_size=1)
    with pytest.raises(ConfigError, match="--micro-batch-size is required"):
        parse_args(without("--micro-batch-size"), world_size=1)
    assert parse_args(without("--global-batch-size"), world_size=2).global_batch_size == 4  # micro-batch x DP
