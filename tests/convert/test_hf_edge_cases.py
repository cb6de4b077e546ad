"""Converter edge cases against HF transformers: a Llama-2 style checkpoint (multi-head attention, i.e. kv heads ==
heads, tied embeddings, vocabulary 163) and a Mixtral with vocabulary 163 convert with every model value written
explicitly into model_flags.txt (nothing inherited from the preset); under TP2 the vocabulary is padded to 256
rows (models/vocab.py), the logits over the real 163 ids match HF's (fp32, max |diff| <= 1e-4, measured ~2e-7)
and the padded ids' logits are -inf (so the loss is the unpadded model's); mcore-to-hf slices the padding off
again and gives back every tensor bit-exactly with the same config. Config fields that change the math and
that we cannot represent are refused with one message naming the field."""

from __future__ import annotations

import json
import shlex

import pytest
import torch

from helpers.cli_subprocess import run_cli
from helpers.hf_parity import MAX_ABS, logits_worker, model_flags, save_reference
from mtmegatron.models.families import ConversionError, get

CASES = ["llama3:mha-tied-163", "mixtral:vocab-163"]


@pytest.mark.parametrize("variant", CASES)
def test_edge_case_converts_matches_hf_under_tp2_and_round_trips(tmp_path, run_ranks, monkeypatch, variant):
    from mtmegatron.convert.hf_io import HFCheckpoint

    monkeypatch.setenv("MTMEGATRON_TEST_START_METHOD", "spawn")
    family = variant.split(":")[0]
    hf_dir, mc_dir, back = tmp_path / "hf", tmp_path / "mcore", tmp_path / "back"
    save_reference(variant, hf_dir)
    run_cli("convert", "hf-to-mcore", "--model", family, "--hf-dir", str(hf_dir), "--out", str(mc_dir),
            "--tensor-model-parallel-size", "2")
    config = json.loads((hf_dir / "config.json").read_text())
    flags = shlex.split((mc_dir / "model_flags.txt").read_text())
    assert flags[flags.index("--num-query-groups") + 1] == str(config["num_key_value_heads"])
    assert "--group-query-attention" in flags  # written even for plain multi-head attention
    tied = config["tie_word_embeddings"]
    assert ("--no-untie-embeddings-and-output-weights" if tied else "--untie-embeddings-and-output-weights") in flags

    reference = torch.load(hf_dir / "reference.pt")
    results = run_ranks(logits_worker, 2, "cpu", model_flags(mc_dir) + ["--tensor-model-parallel-size", "2"],
                        str(mc_dir), reference["tokens"].numpy(), timeout=240)
    ours = torch.as_tensor(results[0])
    assert ours.shape[-1] == 256  # 163 padded to a multiple of 128
    assert torch.isinf(ours[..., 163:]).all() and (ours[..., 163:] < 0).all()
    diff = (ours[..., :163] - reference["logits"]).abs().max().item()
    print(f"\n{variant} tp2: max |logit diff| vs HF over the real vocabulary = {diff:.3e}")
    assert diff <= MAX_ABS

    run_cli("convert", "mcore-to-hf", "--load", str(mc_dir), "--out", str(back))
    original, returned = HFCheckpoint(str(hf_dir)), HFCheckpoint(str(back))
    assert original.names == returned.names  # tied: no lm_head.weight either way
    for name in original.names:
        assert torch.equal(original[name], returned[name]), name
    again = json.loads((back / "config.json").read_text())
    for key in ("vocab_size", "tie_word_embeddings", "num_key_value_heads", "num_attention_heads", "rms_norm_eps",
                "max_position_embeddings", "intermediate_size", "num_local_experts"):
        if key in config:
            assert again[key] == config[key], key
    theta = lambda c: c.get("rope_theta", (c.get("rope_parameters") or {}).get("rope_theta"))  # noqa: E731
    assert theta(again) == theta(config)


BASE = dict(model_type="llama", num_hidden_layers=2, hidden_size=64, intermediate_size=96, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=128, max_position_embeddings=64, hidden_act="silu")


@pytest.mark.parametrize("field,value", [
    ("attention_bias", True), ("mlp_bias", True), ("sliding_window", 16), ("partial_rotary_factor", 0.5),
    ("rope_scaling", {"rope_type": "linear", "factor": 8.0}), ("hidden_act", "gelu"),
])
def test_math_changing_fields_we_cannot_represent_are_refused(field, value):
    with pytest.raises(ConversionError, match=f"field {field}"):
        get("llama3").flags_from_hf({**BASE, field.split(".")[0]: value})


def test_llama3_rope_scaling_converts_with_the_config_values():
    """Not only megatron-core's fixed 1 / 4 / 8192 (absent fields are those values, as in HF)."""
    flags = get("llama3").flags_from_hf({**BASE, "rope_scaling": {"rope_type": "llama3", "factor": 8.0,
                                                              "low_freq_factor": 2.0,
                                                              "original_max_position_embeddings": 4096}})
    given = {f: flags[flags.index(f) + 1] for f in ("--rope-scaling-factor", "--rope-scaling-low-freq-factor",
                                                    "--rope-scaling-high-freq-factor",
                                                    "--rope-scaling-original-max-position-embeddings")}
    assert "--use-rope-scaling" in flags and given == {
        "--rope-scaling-factor": "8.0", "--rope-scaling-low-freq-factor": "2.0",
        "--rope-scaling-high-freq-factor": "4.0", "--rope-scaling-original-max-position-embeddings": "4096"}


def test_harmless_values_of_those_fields_convert():
    flags = get("llama3").flags_from_hf({**BASE, "sliding_window": 64, "attention_bias": False, "mlp_bias": False,
                                     "layer_types": ["full_attention", "full_attention"]})
    assert "--untie-embeddings-and-output-weights" in flags
