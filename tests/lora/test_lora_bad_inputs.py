"""Bad LoRA input is one line and exit status 2, before any process group (``pretrain.main`` in this process):
``--lora-r 0``, an unknown target module, a LoRA flag without ``--lora-r``, ``--lora-load`` without ``--load``
or naming no directory, LoRA on a model it does not serve yet, an MLA target on a model without MLA, LoRA under
Megatron-FSDP in half precision, fp32 adapters under FSDP2. And, in lora/checkpoint.py's check, adapters made
for another base (shapes differ) or with another rank, a base directory holding adapters, an adapter directory
holding none: each one CheckpointError line (pretrain.main reports those as the others, exit status 2)."""

from __future__ import annotations

import pytest

from helpers.pretrain_runner import TINY

BASE = TINY + ["--train-iters", "1", "--num-samples", "0"]
CASES = {
    "rank 0": (["--lora-r", "0"], "--lora-r must be >= 1, not 0"),
    "unknown target": (["--lora-r", "8", "--lora-target-modules", "linear_qkv", "q_proj"],
                       "--lora-target-modules: unknown module 'q_proj'"),
    "flag without rank": (["--lora-alpha", "16"], "--lora-alpha needs --lora-r"),
    "lora-load without load": (["--lora-r", "8", "--lora-load", "."], "--lora-load needs --load"),
    "lora-load missing": (["--lora-r", "8", "--load", ".", "--lora-load", "/nonexistent/adapters"],
                          "--lora-load /nonexistent/adapters: no such directory"),
    "mla target on a dense model": (["--lora-r", "8", "--lora-target-modules", "linear_kv_up_proj"],
                                    "--lora-target-modules linear_kv_up_proj: an MLA projection, and this model "
                                    "has no --multi-latent-attention"),
    "fp32 adapters in an fp32 run": (["--lora-r", "8", "--lora-fp32-adapters"],
                                     "--lora-fp32-adapters needs --bf16 or --fp16"),
    "fp32 adapters under fsdp2": (["--lora-r", "8", "--bf16", "--lora-fp32-adapters", "--use-torch-fsdp2",
                                   "--no-gradient-accumulation-fusion"],
                                  "--lora-fp32-adapters with --use-torch-fsdp2: megatron-core 0.16.1's float16 "
                                  "optimizer takes an fp32 parameter's gradient from its main_grad"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_lora_flags_are_one_line_and_status_2(case, monkeypatch, tmp_path, capsys):
    import mtmegatron
    from mtmegatron import pretrain

    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "TORCHELASTIC_RUN_ID", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)
    extra, message = CASES[case]
    try:
        with pytest.raises(SystemExit) as exit_info:
            pretrain.main(BASE + ["--log-dir", str(tmp_path / "log")] + extra)
    finally:
        mtmegatron.deactivate()
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert exit_info.value.code == 2, lines
    assert len(lines) == 1 and lines[0].startswith("mtmegatron.pretrain: error: ") and message in lines[0], lines


def _args(*extra):
    from mtmegatron.config.arguments import parse_args

    return parse_args(BASE + ["--lora-r", "8", *extra], world_size=1, for_training=False)


def test_the_lora_section_holds_the_flag_values():
    """lora/ reads its flags as the typed, frozen ``Lora`` section (lora/section.py), filled by dest."""
    import dataclasses

    from mtmegatron.lora.section import Lora

    args = _args("--lora-alpha", "16", "--lora-dropout", "0.1", "--lora-target-modules", "linear_qkv", "linear_fc2")
    section = Lora.of(args)
    assert section == Lora(lora_r=8, lora_alpha=16.0, lora_dropout=0.1, lora_target_modules=["linear_qkv",
                           "linear_fc2"], lora_load=None, lora_fp32_adapters=False)
    with pytest.raises(dataclasses.FrozenInstanceError):
        section.lora_r = 4


def test_adapters_of_another_base_or_rank_are_refused(tmp_path):
    from mtmegatron.lora import checkpoint
    from mtmegatron.lora.section import Lora
    from mtmegatron.utils.checkpoint_dirs import CheckpointError

    def record(args):
        return checkpoint.record(Lora.of(args), args.load, args)

    def check(saved, part, directory, args):
        checkpoint.check(saved, part, directory, Lora.of(args), args)

    saved = record(_args("--ffn-hidden-size", "256"))
    resume = ["--load", str(tmp_path), "--lora-load", str(tmp_path)]
    with pytest.raises(CheckpointError, match=rf"^--lora-load {tmp_path}: adapters made for another base "
                                              r"\(ffn_hidden_size: checkpoint 256 vs run 128"):
        check(saved, "adapters", "adapters/iter_0000002", _args(*resume))
    with pytest.raises(CheckpointError, match=r"adapters with --lora-r 8, this run has 4$"):
        check(record(_args()), "adapters", "adapters/iter_0000002", _args("--lora-r", "4", *resume))
    with pytest.raises(CheckpointError, match=r"holds LoRA adapters only .* --lora-load adapters --lora-r 8$"):
        check(saved, "base", "adapters/iter_0000002", _args())
    with pytest.raises(CheckpointError, match=r"holds no LoRA adapters$"):
        check(None, "adapters", "base/iter_0000001", _args())
    older = {k: v for k, v in record(_args()).items() if k != "layout"}  # the shared-A adapters' record
    with pytest.raises(CheckpointError, match=r"adapters written before per-part adapters"):
        check(older, "adapters", "adapters/iter_0000002", _args(*resume))
    check(record(_args()), "adapters", "adapters/iter_0000002", _args())  # the same base and rank: loads


def test_transformer_engine_layers_are_refused_where_te_serves():
    from unittest import mock

    from mtmegatron.utils.errors import ConfigError

    with mock.patch("mtmegatron.backends.cpu.CpuBackend.transformer_engine_missing", return_value=None):  # TE serves
        with pytest.raises(ConfigError, match=r"^--lora-r with TransformerEngine's layers: not supported yet"):
            _args("--transformer-impl", "transformer_engine")
