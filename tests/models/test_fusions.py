"""``models/fusions.py`` on the cpu backend: the start-up line names the fusions that run and why the others do not;
megatron-core's jit fusions stay off on cpu (not measured faster there) unless MTMEGATRON_CPU_JIT_FUSIONS=1, our
RoPE (measured no faster there) unless MTMEGATRON_CPU_ROPE_FUSION=1, and what runs reaches the TransformerConfig. Parse only: no model is built, nothing is compiled."""

from __future__ import annotations

from mtmegatron.backends import cpu as fusions_env
from mtmegatron.backends.musa import MUSA
from mtmegatron.models import fusions
from mtmegatron.config.arguments import parse_args

TINY = ["--model", "llama3", "--model-size", "tiny", "--mock-data", "--backend", "cpu"]


def test_cpu_line_names_what_runs_and_why_the_others_do_not(monkeypatch):
    monkeypatch.delenv(fusions_env.CPU_JIT_ENV, raising=False)
    monkeypatch.delenv(fusions_env.CPU_ROPE_ENV, raising=False)
    args = parse_args(TINY + ["--transformer-impl", "mtmegatron", "--cross-entropy-loss-fusion"], world_size=1)
    line = fusions.describe(args)
    assert line.startswith("mtmegatron: fusions: running cross-entropy | off: "), line
    assert f"rope ({fusions_env.CPU_ROPE_WHY}; {fusions_env.CPU_ROPE_ENV}=1 turns it on)" in line
    assert not fusions.config_fields(args)["apply_rope_fusion"]
    monkeypatch.setenv(fusions_env.CPU_ROPE_ENV, "1")
    line = fusions.describe(args)
    assert line.startswith("mtmegatron: fusions: running rope, cross-entropy | off: "), line
    assert (f"bias-dropout-add ({fusions_env.CPU_JIT_WHY} ({fusions_env.CPU_JIT_ENV}=1 turns them on))") in line
    fields = fusions.config_fields(args)
    assert fields["apply_rope_fusion"] and not fields["bias_dropout_fusion"] and not fields["bias_activation_fusion"]
    off = parse_args(TINY + ["--transformer-impl", "mtmegatron", "--no-rope-fusion"], world_size=1)
    assert "rope (switched off by its flag)" in fusions.describe(off)
    assert not fusions.config_fields(off)["apply_rope_fusion"]


def test_cpu_jit_fusions_on_by_the_environment(monkeypatch):
    monkeypatch.setenv(fusions_env.CPU_JIT_ENV, "1")
    args = parse_args(TINY + ["--transformer-impl", "local"], world_size=1)
    assert "running bias-dropout-add, bias-activation" in fusions.describe(args)
    fields = fusions.config_fields(args)
    assert fields["bias_dropout_fusion"] and fields["bias_activation_fusion"]
    no_bda = parse_args(TINY + ["--transformer-impl", "local", "--no-bias-dropout-fusion"], world_size=1)
    assert not fusions.config_fields(no_bda)["bias_dropout_fusion"]


def test_musa_jit_fusions_follow_the_one_dynamo_switch(monkeypatch):
    """MTMEGATRON_MUSA_DYNAMO is parsed once (backends/musa_runtime.py): =true keeps dynamo and the fusions on."""
    for value, off in (("true", False), ("1", False), ("0", True)):
        monkeypatch.setenv("MTMEGATRON_MUSA_DYNAMO", value)
        assert ("jit" in MUSA.fusions_missing()) is off
