"""Gemma 3 text (``--model gemma3``) against HF transformers' ``Gemma3ForCausalLM`` (tests/helpers/hf_gemma3.py:
6 layers 5 sliding : 1 global, window 4 < SEQ 16, two RoPE bases with linear scaling 8 on the global layer,
query_pre_attn_scalar 24 != head_dim 32 != hidden/heads 16, GQA, tied embeddings, every (1 + w) norm non-zero).

One module fixture converts the tiny random HF model once with ``mtmegatron convert hf-to-mcore`` (and keeps HF's
logits, HF's greedy ``generate`` and a character tokenizer). Then: the converter's flags and its refusals by
field name; fp32 logits at one rank and under TP2 + SP equal HF's (max |diff| <= 1e-4, hf_parity.MAX_ABS); the
``mcore-to-hf`` round trip gives back every tensor bit-exactly and the config fields that define the network; a
2-iteration ``pretrain --load`` starts from HF's loss on the same global batch (1e-5 relative) and moves;
``mtmegatron generate`` (KV cache) gives HF's greedy tokens.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys

import pytest
import torch

from helpers.char_tokenizer import save_char_tokenizer
from helpers.cli_subprocess import ENV, run_cli
from helpers.hf_gemma3 import HERE as HF_GEMMA3, NEW, PROMPT, SEQ, save_reference
from helpers.hf_parity import MAX_ABS, logits_worker

TRAIN = ["--backend", "cpu", "--mock-data", "--seq-length", str(SEQ), "--micro-batch-size", "2",
         "--global-batch-size", "4", "--train-iters", "2", "--lr", "1e-3", "--lr-decay-style", "constant",
         "--log-interval", "100"]


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """(HF dir, mcore dir, tokenizer dir, reference dict), converted once for the module."""
    root = tmp_path_factory.mktemp("gemma3")
    hf_dir, mc_dir, tok_dir = root / "hf", root / "mcore", root / "tokenizer"
    save_char_tokenizer(str(tok_dir))
    save_reference(hf_dir, tok_dir, ENV)
    run_cli("convert", "hf-to-mcore", "--model", "gemma3", "--hf-dir", str(hf_dir), "--out", str(mc_dir))
    return hf_dir, mc_dir, tok_dir, torch.load(hf_dir / "reference.pt")


def _flags(mc_dir) -> list[str]:
    return shlex.split((mc_dir / "model_flags.txt").read_text())


def test_flags_from_hf_and_refusals_by_name(converted):
    from mtmegatron.models import families
    from mtmegatron.models.families import ConversionError

    hf_dir, mc_dir, _, _ = converted
    flags = _flags(mc_dir)
    value = {flags[i]: flags[i + 1] for i in range(len(flags) - 1) if flags[i].startswith("--")}
    assert value["--window-size"] == "3,0" and value["--window-attn-skip-freq"] == "6"
    assert value["--rotary-base"] == "1000000" and value["--rotary-base-local"] == "10000.0"
    assert value["--rotary-seq-len-interpolation-factor"] == "8" and value["--query-pre-attn-scalar"] == "24.0"
    assert value["--kv-channels"] == "32" and "--apply-layernorm-1p" in flags and "--qk-layernorm" in flags
    assert "--no-untie-embeddings-and-output-weights" in flags and "--swiglu" not in flags
    config = json.loads((hf_dir / "config.json").read_text())
    family = families.get("gemma3")
    mixed = dict(config, layer_types=["full_attention", "sliding_attention"] * 3)
    assert family.flags_from_hf(mixed)[family.flags_from_hf(mixed).index("--window-attn-skip-freq") + 1] == \
        "[0,1,0,1,0,1]"
    for field, bad in (("final_logit_softcapping", 30.0), ("attn_logit_softcapping", 50.0),
                       ("use_bidirectional_attention", True), ("attention_bias", True),
                       ("hidden_activation", "silu")):
        with pytest.raises(ConversionError, match=f"config.json field {field} = "):
            family.flags_from_hf(dict(config, **{field: bad}))
    yarn = dict(config, rope_parameters={**config["rope_parameters"], "full_attention": {"rope_type": "yarn",
                                                                                         "factor": 8.0}})
    with pytest.raises(ConversionError, match="rope_parameters.full_attention.rope_type = 'yarn'"):
        family.flags_from_hf(yarn)


@pytest.mark.parametrize("world,extra", [(1, []), (2, ["--tensor-model-parallel-size", "2", "--sequence-parallel"])],
                         ids=["tp1", "tp2-sp"])
def test_logits_match_hf(converted, run_ranks, monkeypatch, world, extra):
    monkeypatch.setenv("MTMEGATRON_TEST_START_METHOD", "spawn")
    _, mc_dir, _, reference = converted
    flags = _flags(mc_dir) + ["--seq-length", str(SEQ), "--micro-batch-size", "1", "--global-batch-size",
                              str(2 * world // (2 if extra else 1))] + extra
    results = run_ranks(logits_worker, world, "cpu", flags, str(mc_dir), reference["tokens"].numpy(), timeout=240)
    ours = torch.as_tensor(results[0])
    assert ours.shape == reference["logits"].shape
    diff = (ours - reference["logits"]).abs().max().item()
    print(f"\ngemma3 {extra or 'tp1'}: max |logit diff| vs HF = {diff:.3e} "
          f"(max |logit| {reference['logits'].abs().max():.3f})")
    assert diff <= MAX_ABS


def test_round_trip_is_exact(converted, tmp_path):
    from mtmegatron.convert.hf_io import HFCheckpoint

    hf_dir, mc_dir, _, _ = converted
    back = tmp_path / "back"
    run_cli("convert", "mcore-to-hf", "--load", str(mc_dir), "--out", str(back))
    original, returned = HFCheckpoint(str(hf_dir)), HFCheckpoint(str(back))
    assert original.names == returned.names
    for name in original.names:
        assert torch.equal(original[name], returned[name]), name
    config = json.loads((back / "config.json").read_text())
    reference = json.loads((hf_dir / "config.json").read_text())
    for key in ("architectures", "model_type", "num_hidden_layers", "hidden_size", "intermediate_size",
                "num_attention_heads", "num_key_value_heads", "head_dim", "vocab_size", "tie_word_embeddings",
                "rms_norm_eps", "query_pre_attn_scalar", "sliding_window", "layer_types", "rope_parameters",
                "hidden_activation", "final_logit_softcapping", "attn_logit_softcapping"):
        assert config.get(key) == reference[key], key


def test_pretrain_load_first_loss_equals_hf(converted, tmp_path):
    from helpers.pretrain_runner import run_pretrain

    from mtmegatron.convert.model import parse_flags
    from mtmegatron.data.section import GptData
    from mtmegatron.training.data import build_mock_dataset

    hf_dir, mc_dir, _, _ = converted
    flags = _flags(mc_dir) + TRAIN + ["--load", str(mc_dir)]
    args = parse_flags(flags)
    dataset = build_mock_dataset(GptData.of(args), (args.train_iters + 1) * args.global_batch_size)
    samples = [dataset[i] for i in range(args.global_batch_size)]
    batch_file = tmp_path / "batch.pt"
    torch.save({k: torch.stack([torch.as_tensor(s[k]) for s in samples]) for k in ("tokens", "labels", "loss_mask")},
               batch_file)
    proc = subprocess.run([sys.executable, str(HF_GEMMA3), "--loss", str(hf_dir), str(batch_file), "2"],
                          capture_output=True, text=True, env=ENV, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    hf_loss = torch.load(batch_file)["hf_loss"]
    trained = tmp_path / "trained"
    _, rows = run_pretrain(1, flags + ["--save", str(trained)], tmp_path / "run")
    losses = [r["loss"] for r in rows]
    assert len(losses) == 2, rows
    # no flags: the training checkpoint's fingerprint names the family and the network (not Qwen3, whose q/k norms
    # it shares): local RoPE base, softmax scale, (1 + w) norms and the global RoPE's linear factor come back
    run_cli("convert", "mcore-to-hf", "--load", str(trained), "--out", str(tmp_path / "hf-auto"))
    config = json.loads((tmp_path / "hf-auto" / "config.json").read_text())
    reference = json.loads((hf_dir / "config.json").read_text())
    for key in ("model_type", "query_pre_attn_scalar", "sliding_window", "layer_types", "rope_parameters",
                "hidden_activation"):
        assert config.get(key) == reference[key], key
    print(f"\ngemma3: first-iteration loss {losses[0]:.7f} vs HF {hf_loss:.7f} (relative "
          f"{abs(losses[0] - hf_loss) / hf_loss:.2e}); second {losses[1]:.7f}")
    assert abs(losses[0] - hf_loss) <= 1e-5 * hf_loss
    assert losses[1] != losses[0]


def test_generate_with_kv_cache_equals_hf_greedy(converted, tmp_path):
    _, mc_dir, tok_dir, reference = converted
    out = tmp_path / "out.jsonl"
    proc = run_cli("generate", "--backend", "cpu", "--load", str(mc_dir), "--tokenizer-model", str(tok_dir),
                   "--max-new-tokens", str(NEW), "--output", str(out), "--prompt", PROMPT)
    (row,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert row["prompt_tokens"] == reference["prompt_tokens"]
    assert len(reference["generated"]) >= 3, reference["generated"]  # long enough to mean something
    assert row["tokens"] == reference["generated"], (row["tokens"], reference["generated"])
    assert "KV cache" in proc.stdout
