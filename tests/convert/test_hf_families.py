"""Today's HF families against HF transformers: Llama-3.1-style RoPE scaling (type llama3), Qwen2.5 (q/k/v
biases, tied embeddings), Qwen3 (q/k RMSNorm per head, head_dim 32 while hidden/heads is 16), Qwen3-MoE (softmax
router with norm_topk_prob, no shared expert) and Mistral (v0.3 style, no sliding window).

Each tiny random HF model is converted once with ``mtmegatron convert hf-to-mcore`` (the CLI), loaded into our
model under TP1 and TP2 (EP2 for Qwen3-MoE) and its fp32 logits compared with HF's: max |diff| <= 1e-4
(test_hf_parity.MAX_ABS). The Llama-3.1 checkpoint without ``--use-rope-scaling`` is far off (so the scaling is
what makes it match). ``mcore-to-hf`` gives back every tensor bit-exactly and the config fields that define the
network. ``pretrain --load`` of the converted checkpoint (two iterations): the first iteration's loss equals
HF's loss on the same global batch (within 1e-4), as a user fine-tuning from HF sees it; the Qwen3-MoE run's
training checkpoint converts back to HF with no flags (from its recorded fingerprint) exactly as with them.
"""

from __future__ import annotations

import json
import shlex
import sys

import pytest
import torch

from helpers.cli_subprocess import run_cli
from helpers.hf_parity import HF_MODELS, MAX_ABS, logits_worker, model_flags, save_reference

# variant (hf_models.CONFIGS key) -> converter --model
FAMILIES = {"llama3:3.1-rope-scaling": "llama3", "llama3:rope-own-values": "llama3", "qwen2.5": "qwen2.5", "qwen3": "qwen3", "qwen3-moe": "qwen3-moe",
            "mistral": "mistral"}
LAYOUTS = {"tp1": (1, []), "tp2": (2, ["--tensor-model-parallel-size", "2"]),
           "ep2": (2, ["--expert-model-parallel-size", "2"])}
# each family once, at the layout that adds its risk (sharded qkv bias, q/k norm under TP, experts under EP);
# the bit-exact round trip and the first-loss test below cover every family at one rank as well
CASES = [("llama3:3.1-rope-scaling", "tp1"), ("llama3:rope-own-values", "tp1"), ("qwen2.5", "tp2"), ("qwen3", "tp2"), ("qwen3-moe", "ep2"),
         ("mistral", "tp1")]
TRAIN = ["--backend", "cpu", "--mock-data", "--seq-length", "16", "--micro-batch-size", "2", "--global-batch-size",
         "4", "--train-iters", "2", "--lr", "1e-3", "--lr-decay-style", "constant", "--log-interval", "100"]


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """variant -> (HF dir, mcore dir, reference logits, tokens); one conversion per variant per module."""
    cache = {}

    def get(variant: str):
        if variant not in cache:
            root = tmp_path_factory.mktemp(variant.replace(":", "-"))
            hf_dir, mc_dir = root / "hf", root / "mcore"
            save_reference(variant, hf_dir)
            run_cli("convert", "hf-to-mcore", "--model", FAMILIES[variant], "--hf-dir", str(hf_dir),
                    "--out", str(mc_dir))
            reference = torch.load(hf_dir / "reference.pt")
            cache[variant] = (hf_dir, mc_dir, reference["logits"], reference["tokens"])
        return cache[variant]

    return get


def _max_diff(run_ranks, flags, world, mc_dir, tokens, reference) -> float:
    results = run_ranks(logits_worker, world, "cpu", flags, str(mc_dir), tokens.numpy(), timeout=240)
    ours = torch.as_tensor(results[0])
    assert ours.shape == reference.shape
    return (ours - reference).abs().max().item()


@pytest.mark.parametrize("variant,layout", CASES, ids=[f"{v}-{lay}" for v, lay in CASES])
def test_logits_match_hf(converted, run_ranks, monkeypatch, variant, layout):
    monkeypatch.setenv("MTMEGATRON_TEST_START_METHOD", "spawn")
    _, mc_dir, reference, tokens = converted(variant)
    world, extra = LAYOUTS[layout]
    diff = _max_diff(run_ranks, model_flags(mc_dir) + extra, world, mc_dir, tokens, reference)
    print(f"\n{variant} {layout}: max |logit diff| vs HF = {diff:.3e} (max |logit| {reference.abs().max():.3f})")
    assert diff <= MAX_ABS, f"{variant} {layout}: max |logit diff| {diff:.3e} > {MAX_ABS}"


OWN_VALUES = {"--rope-scaling-factor": "8.0", "--rope-scaling-low-freq-factor": "2.0",
              "--rope-scaling-high-freq-factor": "6.0", "--rope-scaling-original-max-position-embeddings": "16"}
FIXED_VALUES = {"--rope-scaling-low-freq-factor": "1.0", "--rope-scaling-high-freq-factor": "4.0",
                "--rope-scaling-original-max-position-embeddings": "8192"}  # megatron-core's own


@pytest.mark.parametrize("variant", ["llama3:3.1-rope-scaling", "llama3:rope-own-values"])
def test_llama3_rope_scaling_is_what_makes_it_match(converted, run_ranks, monkeypatch, variant):
    """Without --use-rope-scaling (Llama-3.1), or with megatron-core's fixed values instead of the config's own
    (the flags the converter wrote carry them), the logits are far off."""
    monkeypatch.setenv("MTMEGATRON_TEST_START_METHOD", "spawn")
    _, mc_dir, reference, tokens = converted(variant)
    flags = model_flags(mc_dir)
    assert "--use-rope-scaling" in flags
    if variant == "llama3:3.1-rope-scaling":
        assert flags[flags.index("--rope-scaling-factor") + 1] == "32.0"
        flags.remove("--use-rope-scaling")
    else:
        assert {k: flags[flags.index(k) + 1] for k in OWN_VALUES} == OWN_VALUES
        for flag, value in FIXED_VALUES.items():
            flags[flags.index(flag) + 1] = value
    diff = _max_diff(run_ranks, flags, 1, mc_dir, tokens, reference)
    print(f"\n{variant} without its scaling: max |logit diff| vs HF = {diff:.3e}")
    assert diff > 10 * MAX_ABS  # llama3.1 measured 1.6e-3 (2.6e-7 with the scaling)


@pytest.mark.parametrize("variant", list(FAMILIES))
def test_round_trip_is_exact(converted, tmp_path, variant):
    from mtmegatron.convert.hf_io import HFCheckpoint

    hf_dir, mc_dir, _, _ = converted(variant)
    back = tmp_path / "back"
    run_cli("convert", "mcore-to-hf", "--load", str(mc_dir), "--out", str(back))
    original, returned = HFCheckpoint(str(hf_dir)), HFCheckpoint(str(back))
    assert original.names == returned.names
    for name in original.names:
        assert torch.equal(original[name], returned[name]), name
    config = json.loads((back / "config.json").read_text())
    reference = json.loads((hf_dir / "config.json").read_text())
    assert config["architectures"] == reference["architectures"] and config["model_type"] == reference["model_type"]
    for key in ("num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads", "vocab_size",
                "num_key_value_heads", "head_dim", "tie_word_embeddings", "num_experts", "num_experts_per_tok",
                "moe_intermediate_size", "norm_topk_prob", "rms_norm_eps"):
        if key in reference:
            assert config.get(key) == reference[key], key
    scaling = (reference.get("rope_parameters") or {})
    if scaling.get("rope_type") == "llama3":
        for key in ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"):
            assert config["rope_scaling"][key] == scaling[key], key


def _first_global_batch(flags: list[str]) -> dict:
    """Global batch 0 as pretrain reads it (samples [0, G) of megatron's mock dataset)."""
    from mtmegatron.convert.model import parse_flags
    from mtmegatron.data.section import GptData
    from mtmegatron.training.data import build_mock_dataset

    args = parse_flags(flags)
    dataset = build_mock_dataset(GptData.of(args), (args.train_iters + 1) * args.global_batch_size)
    samples = [dataset[i] for i in range(args.global_batch_size)]
    return {key: torch.stack([torch.as_tensor(s[key]) for s in samples]) for key in ("tokens", "labels", "loss_mask")}


@pytest.mark.parametrize("variant", ["llama3:3.1-rope-scaling", "qwen2.5", "qwen3", "qwen3-moe"])
def test_pretrain_load_first_loss_equals_hf(converted, tmp_path, variant):
    import subprocess

    from helpers.pretrain_runner import run_pretrain
    from helpers.cli_subprocess import ENV

    hf_dir, mc_dir, _, _ = converted(variant)
    flags = shlex.split((mc_dir / "model_flags.txt").read_text()) + TRAIN + ["--load", str(mc_dir)]
    batch_file = tmp_path / "batch.pt"
    torch.save(_first_global_batch(flags), batch_file)
    proc = subprocess.run([sys.executable, str(HF_MODELS), "--loss", str(hf_dir), str(batch_file), "2"],
                          capture_output=True, text=True, env=ENV, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    hf_loss = torch.load(batch_file)["hf_loss"]
    save = ["--save", str(tmp_path / "trained")] if variant == "qwen3-moe" else []
    _, rows = run_pretrain(1, flags + save, tmp_path / "run")
    losses = [r["loss"] for r in rows]
    assert len(losses) == 2, rows
    print(f"\n{variant}: first-iteration loss {losses[0]:.7f} vs HF {hf_loss:.7f} (|diff| "
          f"{abs(losses[0] - hf_loss):.2e}); second {losses[1]:.7f}")
    assert abs(losses[0] - hf_loss) <= 1e-4, (losses[0], hf_loss)
    assert losses[1] != losses[0]  # the second step ran on updated weights
    if save:  # a training checkpoint converts back with no flags: they come from its recorded fingerprint
        from mtmegatron.convert.hf_io import HFCheckpoint

        run_cli("convert", "mcore-to-hf", "--load", save[1], "--out", str(tmp_path / "hf-auto"))
        model_flags = shlex.split((mc_dir / "model_flags.txt").read_text())
        run_cli("convert", "mcore-to-hf", "--load", save[1], "--out", str(tmp_path / "hf-flags"), "--", *model_flags)
        auto, given = HFCheckpoint(str(tmp_path / "hf-auto")), HFCheckpoint(str(tmp_path / "hf-flags"))
        assert auto.names == given.names == HFCheckpoint(str(hf_dir)).names
        assert all(torch.equal(auto[n], given[n]) for n in auto.names)
        assert not torch.equal(auto["model.norm.weight"], HFCheckpoint(str(hf_dir))["model.norm.weight"])  # trained


def test_more_embedding_rows_than_the_tokenizer_trains_with_padded_vocab_size(converted, tmp_path):
    """A converted model whose embedding has more rows than its tokenizer (Qwen2.5's case: 151,936 rows, 151,665
    tokens; here 128 rows and NullTokenizer's 50 ids padded to 64): with Megatron-LM's tokenizer flags the
    model's rows follow the tokenizer, so the load names both sizes and --padded-vocab-size; with it, it trains
    from the checkpoint's rows (its first loss HF's model's with the extra rows' logits masked)."""
    from helpers.pretrain_runner import run_pretrain

    from mtmegatron.convert.model import checkpoint_common
    from mtmegatron.data.resolve import resolve_data
    from mtmegatron.models.fingerprint import describe_mismatches, mismatches
    from mtmegatron.config.arguments import parse_args

    _, mc_dir, _, _ = converted("llama3:rope-own-values")
    flags = (shlex.split((mc_dir / "model_flags.txt").read_text()) + TRAIN
             + ["--load", str(mc_dir), "--tokenizer-type", "NullTokenizer", "--vocab-size", "49",
                "--make-vocab-size-divisible-by", "64", "--log-dir", str(tmp_path / "parse")])
    saved = checkpoint_common(str(mc_dir))["args"]
    assert saved["padded_vocab_size"] == 128
    args = parse_args(flags, world_size=1)
    resolve_data(args, progress=False)
    assert (args.vocab_size, args.padded_vocab_size) == (50, 64)
    assert describe_mismatches(mismatches(saved, args), args) == (
        "checkpoint has 128 embedding rows, this run 64 (vocabulary 50 padded to a multiple of 64): pass "
        "--padded-vocab-size 128")
    _, rows = run_pretrain(1, flags + ["--padded-vocab-size", "128", "--save", str(tmp_path / "trained")],
                           tmp_path / "run")
    assert len(rows) == 2 and rows[1]["loss"] != rows[0]["loss"], rows
    # the rows past the tokenizer came from the checkpoint and stayed (their logits are masked: no gradient;
    # weight decay alone moves them, by lr x wd per step)
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    for directory, out in ((mc_dir / "iter_0000000", tmp_path / "converted.pt"),
                           (tmp_path / "trained" / "iter_0000002", tmp_path / "trained.pt")):
        dcp_to_torch_save(directory, out)
    before, after = torch.load(tmp_path / "converted.pt"), torch.load(tmp_path / "trained.pt")
    for key in ("embedding.word_embeddings.weight", "output_layer.weight"):
        old, new = before[key], after[key]
        assert new.shape[0] == 128 and old[50:].abs().min() > 0
        torch.testing.assert_close(new[50:], old[50:], rtol=1e-4, atol=0)
        assert not torch.equal(new[:50], old[:50])  # the tokenizer's rows trained
