"""``mtmegatron convert`` for LLaVA against HF transformers' ``LlavaForConditionalGeneration`` (hf_llava.py).

* Parity: the tiny random HF LLaVA is converted with the CLI and loaded into our ``--model llava`` under TP1 and
  TP2 (2 spawned ranks); on batches with 0, 1, 2 and mixed 0/1/2 images per sample our fp32 logits at every
  combined position of every sample match HF's within 1e-4 (measured: ~3e-7 at TP1 and TP2, float reduction
  order only; the values are printed).
* Round trips: HF -> mcore -> HF gives back every tensor of the files ``save_pretrained`` wrote bit-exactly,
  under the same names (the CLIP layer after the feature layer and ``post_layernorm`` carried in
  ``hf_unused_vision.safetensors``) and the LLaVA config values; a checkpoint with no HF origin (random init, no
  carried file, no recorded token id) -> HF (with ``--image-token-id``) loads into transformers with every key
  used, gives our logits (the stand-in tower: no extra layer, feature layer -1, identity ``post_layernorm``) and
  converts back to the same mcore tensors bit-exactly.
* Refusals: each unsupported HF setting gives its one message and exit status 2 from the CLI.
* Streaming: a synthetic bf16 LLaVA converts both ways with 2 workers, each in memory bounded by the largest
  tensor (the model is never built), and comes back bit-exactly.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helpers import hf_llava

MAX_ABS = 1e-4
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONWARNINGS": "ignore"}
HELPER = hf_llava.__file__
MARKER = "conversion_complete.json"


def run(*command: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, *command], capture_output=True, text=True, env=ENV, timeout=300)
    assert proc.returncode == 0, f"{' '.join(command)} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    return proc


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """(HF dir, mcore dir, reference) of the tiny LLaVA, converted once with the CLI."""
    root = tmp_path_factory.mktemp("llava")
    hf_dir, mc_dir = root / "hf", root / "mcore"
    run(HELPER, str(hf_dir))
    run("-m", "mtmegatron.cli", "convert", "hf-to-mcore", "--model", "llava", "--hf-dir", str(hf_dir),
        "--out", str(mc_dir))
    return hf_dir, mc_dir, torch.load(hf_dir / "reference.pt")


def model_flags(mc_dir: Path) -> list[str]:
    return shlex.split((mc_dir / "model_flags.txt").read_text()) + ["--micro-batch-size", "1",
                                                                    "--global-batch-size", "1"]


def _logits_worker(rank, world_size, backend_name, flags, checkpoint, batches):
    from megatron.core.tensor_parallel import gather_from_tensor_model_parallel_region

    from helpers.hf_parity import converted_model

    args, model = converted_model(world_size, backend_name, flags, checkpoint)
    out = {}
    for name, (tokens, images, counts) in batches.items():
        tiles = torch.ones(len(images), dtype=torch.int)
        with torch.no_grad():
            logits, _ = model(torch.as_tensor(images), torch.as_tensor(tokens), None, None, num_image_tiles=tiles)
            logits = gather_from_tensor_model_parallel_region(logits)[..., : args.vocab_size]
        out[name] = logits.float()
        if name == "1-image":  # the same batch with blank images: the vision path must matter
            with torch.no_grad():
                blank, _ = model(torch.zeros_like(torch.as_tensor(images)), torch.as_tensor(tokens), None, None,
                                 num_image_tiles=tiles)
            out["1-image:blank"] = gather_from_tensor_model_parallel_region(blank)[..., : args.vocab_size].float()
    return out if rank == 0 else None


def _max_diffs(ours: dict, reference: dict) -> dict:
    """name -> max |diff| over every sample's combined positions (HF length per sample)."""
    diffs = {}
    for name, per_sample in reference.items():
        worst = 0.0
        for i, hf in enumerate(per_sample):
            mine = torch.as_tensor(ours[name])[i, : hf.shape[0]]
            assert mine.shape == hf.shape, (name, i, mine.shape, hf.shape)
            worst = max(worst, (mine - hf).abs().max().item())
        diffs[name] = worst
    return diffs


@pytest.mark.parametrize("tp", [1, 2], ids=["tp1", "tp2"])
def test_logits_match_hf(converted, run_ranks, monkeypatch, tp):
    monkeypatch.setenv("MTMEGATRON_TEST_START_METHOD", "spawn")
    _, mc_dir, reference = converted
    flags = model_flags(mc_dir) + ["--tensor-model-parallel-size", str(tp)]
    ours = run_ranks(_logits_worker, tp, "cpu", flags, str(mc_dir), reference["batches"], timeout=240)[0]
    diffs = _max_diffs(ours, reference["logits"])
    print(f"\nllava tp{tp}: max |logit diff| vs HF per batch: " + ", ".join(f"{k} {v:.2e}" for k, v in diffs.items()))
    assert all(v <= MAX_ABS for v in diffs.values()), diffs
    # the images matter: blank images move our logits far more than the tolerance
    moved = (torch.as_tensor(ours["1-image"]) - torch.as_tensor(ours["1-image:blank"])).abs().max().item()
    assert moved > 100 * MAX_ABS, moved


def test_hf_round_trip_is_exact(converted, tmp_path):
    from safetensors.torch import load_file

    hf_dir, mc_dir, _ = converted
    assert (mc_dir / "hf_unused_vision.safetensors").is_file()
    back = tmp_path / "back"
    run("-m", "mtmegatron.cli", "convert", "mcore-to-hf", "--load", str(mc_dir), "--out", str(back))
    original, returned = load_file(hf_dir / "model.safetensors"), load_file(back / "model.safetensors")
    assert sorted(original) == sorted(returned)  # the layout save_pretrained wrote, name for name
    assert "vision_tower.encoder.layers.2.mlp.fc1.weight" in returned  # the unused third layer came back
    for name, tensor in original.items():
        assert torch.equal(tensor, returned[name]), name
    config, reference = json.loads((back / "config.json").read_text()), json.loads((hf_dir / "config.json").read_text())
    for key in ("image_token_index", "image_seq_length", "vision_feature_layer", "vision_feature_select_strategy",
                "projector_hidden_act"):
        assert config[key] == reference[key], key
    for part, keys in (("vision_config", ("num_hidden_layers", "hidden_size", "intermediate_size", "image_size",
                                         "patch_size", "num_attention_heads", "layer_norm_eps", "projection_dim")),
                       ("text_config", ("num_hidden_layers", "hidden_size", "intermediate_size", "vocab_size",
                                        "num_key_value_heads", "rms_norm_eps", "max_position_embeddings"))):
        for key in keys:
            assert config[part][key] == reference[part][key], (part, key)


_SCRATCH = """
import sys, torch
from mtmegatron.convert.model import build_model, init_single_rank, parse_flags, save_model_only
flags = sys.argv[2:]
args = parse_flags(flags)
init_single_rank(args)
torch.manual_seed(3)
model = build_model(args)  # megatron's random init: a checkpoint with no HF origin
with torch.no_grad():
    for name, p in model.named_parameters():  # non-trivial norms and biases too
        if p.dim() == 1:
            p.add_(torch.randn(p.shape) * 0.1)
save_model_only(model, args, sys.argv[1], model_flags=flags)
"""


def test_scratch_checkpoint_to_hf_and_back(converted, run_ranks, monkeypatch, tmp_path):
    """mcore -> HF -> mcore bit-exact for a checkpoint with no HF origin, and the HF side computes our logits."""
    from safetensors.torch import load_file

    monkeypatch.setenv("MTMEGATRON_TEST_START_METHOD", "spawn")
    _, mc_dir, reference = converted
    flags = shlex.split((mc_dir / "model_flags.txt").read_text())
    scratch, hf_out, again = tmp_path / "scratch", tmp_path / "hf", tmp_path / "again"
    run("-c", _SCRATCH, str(scratch), *flags)
    proc = subprocess.run([sys.executable, "-m", "mtmegatron.cli", "convert", "mcore-to-hf", "--load", str(scratch),
                           "--out", str(hf_out)], capture_output=True, text=True, env=ENV, timeout=300)
    assert proc.returncode == 2 and "--image-token-id" in proc.stderr, proc.stderr[-3000:]
    run("-m", "mtmegatron.cli", "convert", "mcore-to-hf", "--load", str(scratch), "--out", str(hf_out),
        "--image-token-id", str(hf_llava.IMAGE_TOKEN))
    config = json.loads((hf_out / "config.json").read_text())
    assert config["vision_feature_layer"] == -1 and config["vision_config"]["num_hidden_layers"] == 2
    written = load_file(hf_out / "model.safetensors")
    assert torch.equal(written["vision_tower.post_layernorm.weight"], torch.ones(64))
    run(HELPER, "--logits", str(hf_out), str(tmp_path / "hf_logits.pt"))  # loads with every key used
    hf_logits = torch.load(tmp_path / "hf_logits.pt")
    ours = run_ranks(_logits_worker, 1, "cpu", flags + ["--micro-batch-size", "1", "--global-batch-size", "1"],
                     str(scratch), reference["batches"], timeout=240)[0]
    diffs = _max_diffs(ours, hf_logits)
    print(f"\nllava scratch -> HF (stand-in tower): max |logit diff| {max(diffs.values()):.2e}")
    assert all(v <= MAX_ABS for v in diffs.values()), diffs
    run("-m", "mtmegatron.cli", "convert", "hf-to-mcore", "--model", "llava", "--hf-dir", str(hf_out),
        "--out", str(again))
    assert (again / "model_flags.txt").read_text().split() == (mc_dir / "model_flags.txt").read_text().split()
    dumped = run("-c", _DUMP, str(scratch), str(again), *flags).stdout
    assert dumped.strip().endswith("identical"), dumped[-2000:]


_DUMP = """
import sys, torch
from mtmegatron.convert.model import build_model, init_single_rank, load_model, parse_flags
args = parse_flags(sys.argv[3:])
init_single_rank(args)
states = []
for root in sys.argv[1:3]:
    model = build_model(args)
    load_model(model, root)
    states.append({k: v for k, v in model.state_dict().items() if not k.endswith("_extra_state")})
assert sorted(states[0]) == sorted(states[1])
bad = [k for k in states[0] if not torch.equal(states[0][k], states[1][k])]
print(f"{len(states[0])} tensors, differing: {bad}" if bad else f"{len(states[0])} tensors identical")
"""


# ---- refusals ---------------------------------------------------------------------------------------------
def _edited(hf_dir: Path, target: Path, edit) -> Path:
    target.mkdir()
    os.symlink(hf_dir / "model.safetensors", target / "model.safetensors")
    config = json.loads((hf_dir / "config.json").read_text())
    edit(config)
    (target / "config.json").write_text(json.dumps(config))
    return target


REFUSALS = {
    "siglip-tower": (lambda c: c["vision_config"].update(model_type="siglip_vision_model"),
                     "only CLIP (clip_vision_model) towers"),
    "feature-layer-list": (lambda c: c.update(vision_feature_layer=[-2, -1]), "only one feature layer"),
    "select-strategy": (lambda c: c.update(vision_feature_select_strategy="cls"),
                        "vision_feature_select_strategy = 'cls'"),
    "projector-act": (lambda c: c.update(projector_hidden_act="relu"), "projector_hidden_act = 'relu'"),
    "projector-bias": (lambda c: c.update(multimodal_projector_bias=False), "multimodal_projector_bias = false"),
    "image-size": (lambda c: c["vision_config"].update(image_size=36), "not a multiple of patch_size 8"),
    "vision-act": (lambda c: c["vision_config"].update(hidden_act="gelu"), "vision_config.hidden_act = 'gelu'"),
    "text-model": (lambda c: c["text_config"].update(model_type="mistral"), "only Llama language models"),
    "feature-layer-0": (lambda c: c.update(vision_feature_layer=0), "at least one layer"),
    "config-vs-weights": (lambda c: c["vision_config"].update(intermediate_size=80), "config and weights disagree"),
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_unsupported_llava_is_refused(converted, tmp_path, capsys, case):
    from mtmegatron.cli import main

    edit, message = REFUSALS[case]
    hf_dir = _edited(converted[0], tmp_path / "hf", edit)
    # in-process: every refusal comes before any torch compute (config.json and tensor names only)
    status = main(["convert", "hf-to-mcore", "--model", "llava", "--hf-dir", str(hf_dir), "--out",
                   str(tmp_path / "out")]) if case != "config-vs-weights" else None
    if case == "config-vs-weights":  # found by the streaming shape check (meta model): in a subprocess
        proc = subprocess.run([sys.executable, "-m", "mtmegatron.cli", "convert", "hf-to-mcore", "--model", "llava",
                               "--hf-dir", str(hf_dir), "--out", str(tmp_path / "out")], capture_output=True,
                              text=True, env=ENV, timeout=300)
        status, err = proc.returncode, proc.stderr
    else:
        err = capsys.readouterr().err
    assert status == 2 and message in err and "Traceback" not in err, err[-3000:]


def test_target_layout_is_validated(converted, tmp_path, capsys):
    from mtmegatron.cli import main

    status = main(["convert", "hf-to-mcore", "--model", "llava", "--hf-dir", str(converted[0]), "--out",
                   str(tmp_path / "out"), "--tensor-model-parallel-size", "8"])
    err = capsys.readouterr().err
    assert status == 2 and "target layout TP8" in err, err[-3000:]


def test_hf_defaults_match_transformers():
    """The defaults filled into a partial config.json are transformers' own."""
    from transformers import CLIPVisionConfig, LlamaConfig, LlavaConfig

    from mtmegatron.models.families import llava

    llava_config = LlavaConfig()
    for key, value in llava.LLAVA_DEFAULTS.items():
        name = "image_token_id" if key == "image_token_index" else key
        assert getattr(llava_config, name, getattr(llava_config, key, None)) == value, key
    for key, value in llava.LLAVA_VISION_DEFAULTS.items():
        assert getattr(llava_config.vision_config, key) == value, key
    clip = CLIPVisionConfig()
    for key, value in llava.CLIP_VISION_DEFAULTS.items():
        assert getattr(clip, key) == value, key
    llama = LlamaConfig()
    for key, value in llava.LLAMA_DEFAULTS.items():
        if key == "num_key_value_heads":  # None: as many as the attention heads
            value = llama.num_attention_heads
            value_hf = llama.num_key_value_heads
        elif key == "rope_theta":
            value_hf = (getattr(llama, "rope_parameters", None) or {}).get("rope_theta", getattr(llama, key, None))
        else:
            value_hf = getattr(llama, key)
        assert value_hf == value, key


def test_converted_checkpoint_trains(converted, tmp_path):
    """The flags the converter prints + ``--load`` are all pretrain needs: it loads the converted weights (the
    fingerprint check passes) and trains two steps on the embedded dataset."""
    _, mc_dir, _ = converted
    flags = shlex.split((mc_dir / "model_flags.txt").read_text())
    proc = run("-m", "mtmegatron.pretrain", "--backend", "cpu", *flags, "--load", str(mc_dir), "--train-iters", "2",
               "--micro-batch-size", "1", "--global-batch-size", "2", "--log-dir", str(tmp_path / "run"))
    assert f"loaded {mc_dir} (continuing at iteration 0)" in proc.stdout + proc.stderr, proc.stdout[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in rows] == [1, 2] and all(0 < r["loss"] < 20 for r in rows), rows
    assert all(r["image_tokens"] > 0 for r in rows), rows


def test_key_layouts_are_recognised():
    """Each LLaVA key layout resolves to its prefixes (the way back writes the one read); two at once is refused."""
    from mtmegatron.models.families import ConversionError
    from mtmegatron.convert.llava import _find_prefixes

    def names(language, head, vision, projector):
        return [language + "embed_tokens.weight", head, vision + "embeddings.patch_embedding.weight",
                projector + "linear_1.weight"]

    layouts = [("language_model.model.", "language_model.lm_head.weight", "vision_tower.vision_model.",
                "multi_modal_projector."),  # llava-hf releases (transformers 4.x)
               ("language_model.model.", "language_model.lm_head.weight", "vision_tower.", "multi_modal_projector."),
               ("model.language_model.", "lm_head.weight", "model.vision_tower.", "model.multi_modal_projector.")]
    for layout in layouts:
        found = _find_prefixes(names(*layout))
        assert (found["language"], found["head"], found["vision"], found["projector"]) == layout
    with pytest.raises(ConversionError, match="not a LlavaForConditionalGeneration layout"):
        _find_prefixes(names(*layouts[0]) + names(*layouts[2]))


def test_partial_config_gets_hf_defaults():
    """A config.json in LLaVA-1.5-7B's style (text fields left to LlamaConfig's defaults) gives the 7b preset's
    shape: CLIP ViT-L/14-336 minus its last layer, a Llama-2-7B language model."""
    from mtmegatron.convert.llava import flags_from_hf
    from mtmegatron.models.families import preset

    config = {"model_type": "llava", "image_token_index": 32000, "projector_hidden_act": "gelu",
              "vision_feature_layer": -2, "vision_feature_select_strategy": "default", "tie_word_embeddings": False,
              "text_config": {"model_type": "llama", "max_position_embeddings": 4096, "rms_norm_eps": 1e-5,
                              "vocab_size": 32064},
              "vision_config": {"model_type": "clip_vision_model", "hidden_size": 1024, "image_size": 336,
                                "intermediate_size": 4096, "num_attention_heads": 16, "num_hidden_layers": 24,
                                "patch_size": 14, "projection_dim": 768}}
    names = ["language_model.model.embed_tokens.weight", "language_model.lm_head.weight",
             "vision_tower.vision_model.embeddings.patch_embedding.weight", "multi_modal_projector.linear_1.weight"]
    flags, plan = flags_from_hf(config, names)
    value = {flags[i][2:].replace("-", "_"): flags[i + 1] for i in range(len(flags) - 1) if flags[i].startswith("--")}
    expected = preset("llava", "7b")
    for field in ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "vocab_size", "img_h",
                  "patch_dim", "vision_num_layers", "vision_hidden_size", "vision_ffn_hidden_size",
                  "vision_num_attention_heads", "rotary_base"):
        assert int(value[field]) == expected[field], field
    assert float(value["norm_epsilon"]) == expected["layernorm_epsilon"]
    assert "--disable-vision-class-token" in flags
    assert plan.num_hf_layers == 24 and plan.num_used_layers == 23 and plan.record["image_token_index"] == 32000


# ---- streaming: the model is never built ------------------------------------------------------------------
def test_llava_streams_both_ways_in_bounded_memory(tmp_path):
    """A synthetic bf16 LLaVA (a 96 MB Llama, CLIP tower, projector; total >= 8x its largest tensor) converts
    with 2 workers each way: every worker's VmHWM grows by less than 2 x the largest tensor + 48 MB over its
    VmHWM before it read any tensor (the in-memory converter had no workers and built the model), and
    HF -> mcore -> HF gives back every tensor bit-exactly in bf16 (the carried tower layer and post_layernorm
    included)."""
    from helpers.conversion_memory import hwm_within_bound
    from mtmegatron.convert.hf_io import HFCheckpoint

    hf_dir, mc_dir, back = tmp_path / "hf", tmp_path / "mcore", tmp_path / "back"
    run("-c", "import sys; from mtmegatron.convert.synthetic import llama_shape_for, write_llava; "
              "write_llava(sys.argv[1], llama_shape_for(96 * 2**20, hidden=512))", str(hf_dir))
    run("-m", "mtmegatron.cli", "convert", "hf-to-mcore", "--model", "llava", "--hf-dir", str(hf_dir), "--out",
        str(mc_dir), "--workers", "2")
    run("-m", "mtmegatron.cli", "convert", "mcore-to-hf", "--load", str(mc_dir), "--out", str(back), "--workers", "2")
    for what, stats in (("llava hf-to-mcore", json.loads((mc_dir / MARKER).read_text())),
                        ("llava mcore-to-hf", json.loads((back / MARKER).read_text()))):
        hwm_within_bound(stats, what, bites=False)  # 8 MB tensors: the bound shows the model is never built (>= 96 MB)
    original, returned = HFCheckpoint(str(hf_dir), dtype=None), HFCheckpoint(str(back), dtype=None)
    assert original.names == returned.names and "vision_tower.vision_model.encoder.layers.2.mlp.fc1.weight" in returned
    for name in original.names:
        ours = returned[name]
        assert ours.dtype == torch.bfloat16 and torch.equal(original[name], ours), name
