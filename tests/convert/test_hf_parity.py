"""HF transformers is the reference: tiny random Llama (GQA), Mixtral and DeepSeek-V3 (first-k dense, shared
expert, group-limited sigmoid router with a non-zero correction bias, MLA with q LoRA, YaRN, MTP layer) are
saved as safetensors, converted with ``mtmegatron convert hf-to-mcore`` (the CLI, in a subprocess), loaded into
our model under TP1, TP2 and (MoE) EP2, and the fp32 logits are compared with HF's.

Tolerance: max |logit difference| <= 1e-4 (measured: ~2e-7, float reduction order only).
Round trip: ``hf-to-mcore`` then ``mcore-to-hf`` gives back every tensor of the original files bit-exactly
(DeepSeek's MTP layer and correction bias included; the Llama checkpoint is written sharded with an index).
"""

from __future__ import annotations

import json

import pytest
import torch

from helpers.cli_subprocess import run_cli
from helpers.hf_parity import MAX_ABS, logits_worker, model_flags, save_reference

FAMILIES = ["llama3", "mixtral", "deepseek-v3"]
LAYOUTS = {
    "tp1": (1, []),
    "tp2": (2, ["--tensor-model-parallel-size", "2"]),
    "ep2": (2, ["--expert-model-parallel-size", "2"]),
}
CASES = [(f, lay) for f in FAMILIES for lay in LAYOUTS if not (lay == "ep2" and f == "llama3")]


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """family -> (HF dir, mcore dir, HF reference logits, tokens); conversions happen once per module."""
    cache = {}

    def get(family: str):
        if family not in cache:
            root = tmp_path_factory.mktemp(family)
            hf_dir, mc_dir = root / "hf", root / "mcore"
            save_reference(family, hf_dir, shard=family == "llama3")
            run_cli("convert", "hf-to-mcore", "--model", family, "--hf-dir", str(hf_dir), "--out", str(mc_dir))
            reference = torch.load(hf_dir / "reference.pt")
            cache[family] = (hf_dir, mc_dir, reference["logits"], reference["tokens"])
        return cache[family]

    return get


@pytest.mark.parametrize("family,layout", CASES, ids=[f"{f}-{lay}" for f, lay in CASES])
def test_logits_match_hf(converted, run_ranks, monkeypatch, family, layout):
    # spawned ranks: a rank forked from a pytest process that already ran torch code can hang
    monkeypatch.setenv("MTMEGATRON_TEST_START_METHOD", "spawn")
    hf_dir, mc_dir, reference, tokens = converted(family)
    world, extra = LAYOUTS[layout]
    results = run_ranks(logits_worker, world, "cpu", model_flags(mc_dir) + extra, str(mc_dir), tokens.numpy(),
                        timeout=240)
    ours = torch.as_tensor(results[0])
    assert ours.shape == reference.shape
    diff = (ours - reference).abs().max().item()
    print(f"\n{family} {layout}: max |logit diff| vs HF = {diff:.3e} (max |logit| {reference.abs().max():.3f})")
    assert diff <= MAX_ABS, f"{family} {layout}: max |logit diff| {diff:.3e} > {MAX_ABS}"


@pytest.mark.parametrize("family", FAMILIES)
def test_round_trip_is_exact(converted, tmp_path, family):
    from mtmegatron.convert.hf_io import HFCheckpoint

    hf_dir, mc_dir, _, _ = converted(family)
    back = tmp_path / "back"
    run_cli("convert", "mcore-to-hf", "--load", str(mc_dir), "--out", str(back))
    original, returned = HFCheckpoint(str(hf_dir)), HFCheckpoint(str(back))
    assert original.names == returned.names
    for name in original.names:
        assert torch.equal(original[name], returned[name]), name
    if family == "deepseek-v3":
        assert any(".mlp.gate.e_score_correction_bias" in n for n in original.names)
        assert any(n.startswith("model.layers.4.eh_proj") for n in original.names)  # the MTP layer came back
    config = json.loads((back / "config.json").read_text())
    reference = json.loads((hf_dir / "config.json").read_text())
    for key in ("num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads", "vocab_size",
                "num_key_value_heads", "num_local_experts", "n_routed_experts", "moe_intermediate_size",
                "first_k_dense_replace", "q_lora_rank", "kv_lora_rank", "n_group", "topk_group"):
        if key in reference:
            assert config.get(key) == reference[key], key
