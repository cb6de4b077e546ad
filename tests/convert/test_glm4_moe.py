"""GLM-4.5 (``--model glm4.5``) against HF transformers' ``Glm4MoeForCausalLM`` (tests/helpers/hf_glm4_moe.py: q/k/v
biases, q/k norm, partial rotary 0.5, first-k dense + MoE with a shared expert, the group-limited sigmoid router
with expert bias and scaling, an MTP layer in the files).

The tiny random HF model is converted once with ``mtmegatron convert hf-to-mcore`` (the CLI). Then: fp32 logits
equal HF's (max |diff| <= 1e-4) at one rank, and under TP2 + sequence parallel and with the experts on EP2 (one
two-rank spawn); with full rotary instead of the converted ``--rotary-percent 0.5`` they are far off (so the
partial rotary is what makes them match); ``mcore-to-hf`` gives every tensor back bit-exactly (the MTP layer's
too) with the config fields that define the network; ``pretrain --load`` (two iterations) starts at HF's loss on
the same global batch (1e-5 relative); ``mtmegatron generate`` (KV cache) gives HF ``generate``'s greedy tokens.
Config fields the converter cannot reproduce are refused by name.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helpers.child_path import with_tests_on_path
from helpers.cli_subprocess import ENV, run_cli
from helpers.hf_glm4_moe import NEW_TOKENS, PROMPTS
from helpers.hf_parity import HF_MODELS, MAX_ABS, logits_worker, model_flags

HELPER = Path(__file__).parents[1] / "helpers" / "hf_glm4_moe.py"
TRAIN = ["--backend", "cpu", "--mock-data", "--seq-length", "16", "--micro-batch-size", "2", "--global-batch-size",
         "4", "--train-iters", "2", "--lr", "1e-3", "--lr-decay-style", "constant", "--log-interval", "100"]


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """(HF dir, mcore dir, tokenizer dir, reference.pt) of the one conversion this module shares."""
    root = tmp_path_factory.mktemp("glm45")
    hf_dir, mc_dir, tok_dir = root / "hf", root / "mcore", root / "tokenizer"
    proc = subprocess.run([sys.executable, str(HELPER), str(hf_dir), str(tok_dir)], capture_output=True, text=True,
                          env=with_tests_on_path(ENV), timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    run_cli("convert", "hf-to-mcore", "--model", "glm4.5", "--hf-dir", str(hf_dir), "--out", str(mc_dir))
    return hf_dir, mc_dir, tok_dir, torch.load(hf_dir / "reference.pt")


def _layouts_worker(rank, world_size, backend_name, flag_sets, checkpoint, tokens):
    """``logits_worker`` for each flag set in turn in one spawn (model parallel state rebuilt between them)."""
    from megatron.core import parallel_state

    out = []
    for flags in flag_sets:
        parallel_state.destroy_model_parallel()
        out.append(logits_worker(rank, world_size, backend_name, flags, checkpoint, tokens))
    return out if rank == 0 else None


def _max_diffs(run_ranks, flag_sets, world, converted) -> list[float]:
    _, mc_dir, _, reference = converted
    (results, *_) = run_ranks(_layouts_worker, world, "cpu", flag_sets, str(mc_dir), reference["tokens"].numpy(),
                              timeout=240)
    diffs = []
    for ours in results:
        ours = torch.as_tensor(ours)
        assert ours.shape == reference["logits"].shape
        diffs.append((ours - reference["logits"]).abs().max().item())
    return diffs


def test_converted_flags_name_every_feature(converted):
    flags = model_flags(converted[1])
    for expected in (["--rotary-percent", "0.5"], ["--kv-channels", "32"], ["--moe-layer-freq", "([0]*1+[1]*2)"],
                     ["--moe-shared-expert-intermediate-size", "64"], ["--moe-router-num-groups", "4"],
                     ["--moe-router-group-topk", "2"], ["--moe-router-topk-scaling-factor", "2.5"]):
        assert flags[flags.index(expected[0]) + 1] == expected[1], expected
    assert {"--add-qkv-bias", "--qk-layernorm", "--moe-router-enable-expert-bias"} <= set(flags)
    recorded = shlex.split((converted[1] / "model_flags.txt").read_text())
    assert recorded[recorded.index("--mtp-num-layers") + 1] == "1"  # the files' MTP layer was converted


def test_logits_match_hf_one_rank_and_partial_rotary_matters(converted, run_ranks, monkeypatch):
    monkeypatch.setenv("MTMEGATRON_TEST_START_METHOD", "spawn")
    flags = model_flags(converted[1])
    full = list(flags)
    full[full.index("--rotary-percent") + 1] = "1.0"
    diff, full_diff = _max_diffs(run_ranks, [flags, full], 1, converted)
    print(f"\nglm4.5 tp1: max |logit diff| vs HF = {diff:.3e}; with full rotary {full_diff:.3e}")
    assert diff <= MAX_ABS
    assert full_diff > 10 * MAX_ABS


def test_logits_match_hf_tp2_sp_and_ep2(converted, run_ranks, monkeypatch):
    """TP2 with sequence parallelism (sharded q/k/v biases, q/k norms, partial rotary per head), then the experts
    on EP2 (expert bias and groups over the expert-parallel ranks), in one two-rank spawn (this configuration
    checks EP x TP against the world size without expert TP, so TP2 x EP2 together needs four ranks)."""
    monkeypatch.setenv("MTMEGATRON_TEST_START_METHOD", "spawn")
    layouts = [["--tensor-model-parallel-size", "2", "--sequence-parallel"], ["--expert-model-parallel-size", "2"]]
    diffs = _max_diffs(run_ranks, [model_flags(converted[1]) + layout for layout in layouts], 2, converted)
    print(f"\nglm4.5 tp2+sp, ep2: max |logit diff| vs HF = {diffs[0]:.3e}, {diffs[1]:.3e}")
    assert max(diffs) <= MAX_ABS


def test_round_trip_is_exact(converted, tmp_path):
    from mtmegatron.convert.hf_io import HFCheckpoint

    hf_dir, mc_dir, _, _ = converted
    back = tmp_path / "back"
    run_cli("convert", "mcore-to-hf", "--load", str(mc_dir), "--out", str(back))
    original, returned = HFCheckpoint(str(hf_dir)), HFCheckpoint(str(back))
    assert original.names == returned.names
    assert any(name.startswith("model.layers.3.eh_proj") for name in original.names)  # the MTP layer
    for name in original.names:
        assert torch.equal(original[name], returned[name]), name
    config = json.loads((back / "config.json").read_text())
    reference = json.loads((hf_dir / "config.json").read_text())
    for key in ("architectures", "model_type", "num_hidden_layers", "hidden_size", "intermediate_size",
                "num_attention_heads", "num_key_value_heads", "head_dim", "vocab_size", "tie_word_embeddings",
                "attention_bias", "use_qk_norm", "first_k_dense_replace", "n_routed_experts", "n_shared_experts",
                "num_experts_per_tok", "moe_intermediate_size", "n_group", "topk_group", "routed_scaling_factor",
                "norm_topk_prob", "rms_norm_eps", "num_nextn_predict_layers", "rope_parameters"):
        assert config[key] == reference[key], key


def _first_global_batch(flags: list[str]) -> dict:
    """Global batch 0 as pretrain reads it (samples [0, G) of megatron's mock dataset)."""
    from mtmegatron.convert.model import parse_flags
    from mtmegatron.data.section import GptData
    from mtmegatron.training.data import build_mock_dataset

    args = parse_flags(flags)
    dataset = build_mock_dataset(GptData.of(args), (args.train_iters + 1) * args.global_batch_size)
    samples = [dataset[i] for i in range(args.global_batch_size)]
    return {key: torch.stack([torch.as_tensor(s[key]) for s in samples]) for key in ("tokens", "labels", "loss_mask")}


def test_pretrain_load_first_loss_equals_hf(converted, tmp_path):
    from helpers.pretrain_runner import run_pretrain

    hf_dir, mc_dir, _, _ = converted
    flags = shlex.split((mc_dir / "model_flags.txt").read_text()) + TRAIN + ["--load", str(mc_dir)]
    batch_file = tmp_path / "batch.pt"
    torch.save(_first_global_batch(flags), batch_file)
    proc = subprocess.run([sys.executable, str(HF_MODELS), "--loss", str(hf_dir), str(batch_file), "2"],
                          capture_output=True, text=True, env=ENV, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    hf_loss = torch.load(batch_file)["hf_loss"]
    _, rows = run_pretrain(1, flags, tmp_path / "run")
    losses = [r["loss"] for r in rows]
    assert len(losses) == 2, rows
    print(f"\nglm4.5: first-iteration loss {losses[0]:.7f} vs HF {hf_loss:.7f} (relative diff "
          f"{abs(losses[0] - hf_loss) / hf_loss:.2e}); second {losses[1]:.7f}")
    assert abs(losses[0] - hf_loss) <= 1e-5 * hf_loss, (losses[0], hf_loss)
    assert losses[1] != losses[0]  # the second step ran on updated weights


def test_generate_greedy_equals_hf(converted, tmp_path):
    _, mc_dir, tok_dir, reference = converted
    out = tmp_path / "out.jsonl"
    run_cli("generate", "--backend", "cpu", "--load", str(mc_dir), "--tokenizer-model", str(tok_dir),
            "--max-new-tokens", str(NEW_TOKENS), "--output", str(out), *[a for p in PROMPTS for a in ("--prompt", p)])
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["prompt_tokens"] for r in rows] == [g["prompt_tokens"] for g in reference["greedy"]]
    assert [r["tokens"] for r in rows] == [g["tokens"] for g in reference["greedy"]]
    assert any(len(g["tokens"]) >= 4 for g in reference["greedy"]), reference["greedy"]  # long enough to mean something


def _hf_config(**changes) -> dict:
    base = {"model_type": "glm4_moe", "num_hidden_layers": 3, "hidden_size": 64, "intermediate_size": 160,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "vocab_size": 128,
            "max_position_embeddings": 64, "rms_norm_eps": 1e-5, "attention_bias": True, "n_routed_experts": 8,
            "num_experts_per_tok": 4, "moe_intermediate_size": 32, "n_shared_experts": 1,
            "first_k_dense_replace": 1, "n_group": 1, "topk_group": 1, "rope_theta": 10000.0}
    return {**base, **changes}


@pytest.mark.parametrize("changes,named", [
    ({"attention_bias": False}, "attention_bias"),
    ({"norm_topk_prob": False}, "norm_topk_prob"),
    ({"scoring_func": "softmax"}, "scoring_func"),
    ({"n_group": 4, "topk_group": 1}, "n_group/topk_group"),
    ({"partial_rotary_factor": 0.3}, "partial_rotary_factor"),
    ({"hidden_act": "gelu"}, "hidden_act"),
], ids=["attention_bias", "norm_topk_prob", "scoring_func", "groups", "partial_rotary_factor", "hidden_act"])
def test_unrepresentable_fields_are_refused_by_name(changes, named):
    from mtmegatron.models.families import ConversionError, get

    with pytest.raises(ConversionError, match=named):
        get("glm4.5").flags_from_hf(_hf_config(**changes))


def test_partial_rotary_factor_defaults_to_half_and_is_read_where_transformers_5_writes_it():
    from mtmegatron.models.families import get

    def percent(config):
        flags = get("glm4.5").flags_from_hf(config)
        return flags[flags.index("--rotary-percent") + 1]

    assert percent(_hf_config()) == "0.5"  # Glm4MoeConfig's default
    assert percent(_hf_config(rope_parameters={"rope_type": "default", "rope_theta": 1e4,
                                               "partial_rotary_factor": 0.25})) == "0.25"
    assert percent(_hf_config(partial_rotary_factor=1.0)) == "1.0"
