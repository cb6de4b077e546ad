"""``--model qwen2-vl`` / ``qwen2.5-vl`` (tiny presets) against HF transformers' ``Qwen2VLForConditionalGeneration``
/ ``Qwen2_5_VLForConditionalGeneration`` at one rank, cpu backend, fp32.

One worker process builds our model from the preset, builds the HF model from the family's ``hf_config`` (random
init, every tensor then perturbed so that no norm is the identity and no bias zero), loads our model through the
family's ``hf_map`` from the tensors ``save_pretrained`` wrote (the converter's one table: every mcore tensor
written, every HF tensor read), and runs one batch through both:
* two samples, three images of three sizes (grid_thw 1x4x6, 1x8x4 and 1x6x6 patches) made by HF's
  ``Qwen2VLImageProcessorPil`` from PIL images and one video (2 temporal patches of 4x4: its slabs attend each to
  itself); sample 0 holds two images, sample 1 an image and the video; the 3-D position ids from HF's
  ``get_rope_index`` are the input of both models;
* logits at every position within 1e-5 (measured: Qwen2-VL 3.1e-6, Qwen2.5-VL 3.0e-6, on logits up to
  2.8; TP2 and TP2+SP 3.1e-6 for both; float summation order only);
* the images matter: the same batch with blank images moves our logits by far more than the tolerance;
* text only (2-D positions): the same logits as HF's text path, and a zero gradient for every encoder parameter;
* backward: the gradient of one random projection of the logits, every HF parameter's mapped like its weight,
  within 1e-5 of the gradient's scale for every parameter of both towers (measured: 2.1e-6 relative at worst);
* Qwen2.5-VL: its tiny ViT attends in windows of 2x2 merge blocks in layer 0 (full attention in layer 1), so the
  three images make 2, 2 and 4 windows (some cut at the edge); the same model without windows gives other logits;
* the converter: HF ``save_pretrained`` -> ``hf_to_mcore`` (flags from config.json) -> our model loaded from the
  checkpoint gives HF's logits, at one rank and under TP2 with and without sequence parallelism (2 spawned
  ranks); ``mcore_to_hf`` writes the same tensors back bit-exactly;
* ``--freeze-LM`` / ``--freeze-ViT`` / ``--freeze-projection`` leave the rest trainable;
* pipeline: PP2 with the vision encoder and 1 language layer on stage 0, 3 layers on stage 1, through
  megatron-core's schedule: the one-rank per-token losses (measured 1.9e-6 on losses of ~7).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import torch

MAX_ABS = 1e-5
FLAGS = ["--micro-batch-size", "1", "--global-batch-size", "1"]


def _images_and_grids(args):
    """pixel_values, grid_thw from HF's processor for three images of different sizes."""
    import numpy as np
    from PIL import Image
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    rng = np.random.default_rng(0)
    sizes = [(56, 84), (112, 56), (84, 84)]  # (height, width) in pixels: 4x6, 8x4, 6x6 patches of 14
    images = [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for h, w in sizes]
    processor = Qwen2VLImageProcessorPil(min_pixels=28 * 28, max_pixels=112 * 112, patch_size=args.patch_dim,
                                         temporal_patch_size=args.vision_temporal_patch_size,
                                         merge_size=args.vision_spatial_merge_size)
    out = processor(images=images, return_tensors="pt")
    return out["pixel_values"].float(), out["image_grid_thw"]


def _video(args, gen):
    """pixel_values_videos, video_grid_thw of one 4-frame 56x56 video (2 temporal patches of 4x4), built directly
    in the processor's layout (rows: temporal slab, then merge block, then patch; C*T*P*P values each)."""
    grid = torch.tensor([[2, 4, 4]])
    width = 3 * args.vision_temporal_patch_size * args.patch_dim ** 2
    return torch.randn(int(grid.prod()), width, generator=gen), grid


def _tokens(args, grid_thw, video_grid_thw, gen):
    """Two samples of equal length: [text, <start>, image 0, <end>, text, <start>, image 1, <end>, text] and
    [text, <start>, image 2, <end>, text, <start>, video, <end>, text]; text ids are random below the special ids."""
    unit = args.vision_spatial_merge_size ** 2
    merged = (grid_thw.prod(-1) // unit).tolist()

    def text(n):
        return torch.randint(0, args.vision_start_token_id, (n,), generator=gen).tolist()

    def span(token, n):
        return [args.vision_start_token_id] + [token] * n + [args.vision_end_token_id]

    first = text(5) + span(args.image_token_id, merged[0]) + text(3) + span(args.image_token_id, merged[1]) + text(10)
    second = text(7) + span(args.image_token_id, merged[2]) + text(2)
    second += span(args.video_token_id, int(video_grid_thw.prod()) // unit)
    second += text(len(first) - len(second))
    return torch.tensor([first, second])


def _worker(family_name: str, architecture: str, root: str):
    import transformers
    from safetensors.torch import load_file

    from mtmegatron.convert.model import build_model, init_single_rank, parse_flags
    from mtmegatron.models import families

    args = parse_flags(["--model", family_name, "--model-size", "tiny", *FLAGS])
    init_single_rank(args)
    model = build_model(args).eval()
    family = families.get(family_name)
    trainable = {}  # LLaVA's freeze flags on this model: the names of what still trains
    for freeze in (["--freeze-ViT", "--freeze-projection"], ["--freeze-LM", "--freeze-ViT"]):
        frozen = build_model(parse_flags(["--model", family_name, "--model-size", "tiny", *FLAGS, *freeze]))
        trainable[" ".join(freeze)] = sorted({n.split(".")[1] for n, p in frozen.named_parameters() if p.requires_grad})

    config = transformers.AutoConfig.for_model(**family.hf_config(args))
    torch.manual_seed(0)
    hf = getattr(transformers, architecture)(config).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(0.05 * torch.randn_like(p))
    hf.save_pretrained(f"{root}/hf")
    hf_state = load_file(f"{root}/hf/model.safetensors")  # the names on disk, which the map (and converter) read

    ours = model.state_dict()
    written, read = set(), set()
    with torch.no_grad():
        for entry in family.hf_map(args):
            if entry.to_mcore is None:
                continue
            ours[entry.mcore].copy_(entry.to_mcore(*(hf_state[n] for n in entry.hf)))
            written.add(entry.mcore)
            read.update(entry.hf)
    params = {k for k, v in ours.items() if isinstance(v, torch.Tensor) and "_extra_state" not in k}
    model.load_state_dict(ours)

    pixel_values, grid_thw = _images_and_grids(args)
    gen = torch.Generator().manual_seed(1)
    video, video_grid_thw = _video(args, gen)
    input_ids = _tokens(args, grid_thw, video_grid_thw, gen)
    token_type = (input_ids == args.image_token_id).int() + 2 * (input_ids == args.video_token_id).int()
    position_ids, _ = hf.model.get_rope_index(input_ids, token_type, image_grid_thw=grid_thw,
                                              video_grid_thw=video_grid_thw)
    pixels = dict(pixel_values=pixel_values, image_grid_thw=grid_thw, pixel_values_videos=video,
                  video_grid_thw=video_grid_thw)  # the same keyword names in HF's forward and ours
    text_ids = torch.randint(0, args.vision_start_token_id, (2, 24), generator=gen)
    with torch.no_grad():
        hf_logits = hf(input_ids=input_ids, position_ids=position_ids, mm_token_type_ids=token_type, **pixels).logits
        logits = model(input_ids, position_ids, None, **pixels)
        blank = model(input_ids, position_ids, None, **{**pixels, "pixel_values": torch.zeros_like(pixel_values)})
        hf_text = hf(input_ids=text_ids).logits
        text = model(text_ids, torch.arange(24).expand(2, -1), None)
        windows, model.vision_model.window = model.vision_model.window, None
        no_windows = model(input_ids, position_ids, None, **pixels)
        model.vision_model.window = windows
        labels = torch.roll(input_ids, -1, dims=1)
        token_losses = model(input_ids, position_ids, None, labels=labels, **pixels)
    grad_diffs = _gradient_diffs(model, hf, family, args, (input_ids, position_ids, pixels, token_type))
    model.zero_grad(set_to_none=True)  # a text-only micro-batch: the encoder's parameters get zero gradients
    model(text_ids, torch.arange(24).expand(2, -1), None).sum().backward()
    text_only_encoder_grads = [None if p.grad is None else p.grad.abs().max().item()
                               for p in model.vision_model.parameters()]
    converted = _through_the_converter(root, family, (input_ids, position_ids, pixels))
    vocab = args.vocab_size
    return {"missing": sorted(params - written), "unread": sorted(set(hf_state) - read),
            "grid_thw": grid_thw, "position_ids": position_ids, "image_tokens": int((token_type == 1).sum()),
            "video_tokens": int((token_type == 2).sum()),
            "diff": (logits[..., :vocab] - hf_logits).abs().max().item(),
            "blank_moves": (blank - logits).abs().max().item(),
            "text_diff": (text[..., :vocab] - hf_text).abs().max().item(), "windows": windows,
            "no_windows_moves": (no_windows - logits).abs().max().item(),
            "scale": hf_logits.abs().max().item(),
            "converted_diff": (converted["logits"][..., :vocab] - hf_logits).abs().max().item(),
            "flags": converted["flags"], "round_trip_differs": converted["round_trip_differs"],
            "batch": (input_ids, position_ids, pixels), "hf_logits": hf_logits, "grad_diffs": grad_diffs,
            "labels": labels, "token_losses": token_losses, "trainable": trainable,
            "text_only_encoder_grads": text_only_encoder_grads}


def _memory_name(disk_name: str) -> str:
    """transformers 5's in-memory name of a Qwen VL tensor saved as ``disk_name``."""
    if disk_name.startswith("visual."):
        return "model." + disk_name
    if disk_name.startswith("model."):
        return "model.language_model." + disk_name[len("model."):]
    return disk_name


def _gradient_diffs(model, hf, family, args, batch) -> dict:
    """The gradient of one random projection of the logits in both models, every HF tensor's mapped to ours:
    mcore name -> (max |diff|, max |grad|)."""
    input_ids, position_ids, pixels, token_type = batch
    weights = torch.randn(*input_ids.shape, args.vocab_size, generator=torch.Generator().manual_seed(2))
    (model(input_ids, position_ids, None, **pixels)[..., : args.vocab_size] * weights).sum().backward()
    (hf(input_ids=input_ids, position_ids=position_ids, mm_token_type_ids=token_type, **pixels).logits
     * weights).sum().backward()
    hf_grads = {name: p.grad for name, p in hf.named_parameters()}
    ours = dict(model.named_parameters())
    diffs = {}
    for entry in family.hf_map(args):
        if entry.to_mcore is not None:
            expected = entry.to_mcore(*(hf_grads[_memory_name(n)] for n in entry.hf))
            got = ours[entry.mcore].main_grad if ours[entry.mcore].grad is None else ours[entry.mcore].grad
            diffs[entry.mcore] = ((got - expected).abs().max().item(), expected.abs().max().item())
    return diffs


def _through_the_converter(root, family, batch):
    """``hf_to_mcore`` of the saved HF model (flags from its config.json), our model built from those flags and
    loaded from the checkpoint, its logits on ``batch``; and ``mcore_to_hf`` back: the HF tensors that differ."""
    from megatron.core import parallel_state
    from safetensors.torch import load_file

    from mtmegatron.convert.commands import hf_to_mcore, mcore_to_hf
    from mtmegatron.convert.model import build_model, load_model, parse_flags

    input_ids, position_ids, pixels = batch
    parallel_state.destroy_model_parallel()  # each converter call sets up its own one-rank parallel state
    flags = hf_to_mcore(f"{root}/hf", f"{root}/mcore", family.name)
    model = build_model(parse_flags(flags + FLAGS))
    load_model(model, f"{root}/mcore")
    with torch.no_grad():
        logits = model.eval()(input_ids, position_ids, None, **pixels)
    parallel_state.destroy_model_parallel()
    mcore_to_hf(f"{root}/mcore", f"{root}/back")
    before, after = load_file(f"{root}/hf/model.safetensors"), load_file(f"{root}/back/model.safetensors")
    differs = sorted(n for n in set(before) | set(after) if n not in before or n not in after
                     or not torch.equal(before[n], after[n]))
    return {"logits": logits, "flags": flags, "round_trip_differs": differs}


CASES = {"qwen2-vl": "Qwen2VLForConditionalGeneration", "qwen2.5-vl": "Qwen2_5_VLForConditionalGeneration"}


@pytest.fixture(scope="module", params=list(CASES))
def result(request, tmp_path_factory):
    root = tmp_path_factory.mktemp("qwen_vl")
    out = root / "result.pt"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore", "HF_HUB_OFFLINE": "1"}
    # one plain process (not a forked rank: torch compute earlier in the pytest process can hang a fork)
    proc = subprocess.run([sys.executable, __file__, str(out), request.param, CASES[request.param], str(root)],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-4000:]
    result = torch.load(out)
    print(request.param, {k: v for k, v in result.items() if k in ("diff", "blank_moves", "text_diff", "scale",
                                                                   "no_windows_moves", "converted_diff")})
    return request.param, result, root


def _tp_logits_worker(rank, world_size, backend_name, flags, checkpoint, batch):
    from megatron.core.tensor_parallel import gather_from_tensor_model_parallel_region

    from helpers.hf_parity import converted_model

    args, model = converted_model(world_size, backend_name, flags, checkpoint)
    input_ids, position_ids, pixels = batch
    with torch.no_grad():
        logits = model(input_ids, position_ids, None, **pixels)
        logits = gather_from_tensor_model_parallel_region(logits)[..., : args.vocab_size]
    return logits if rank == 0 else None


def test_map_covers_both_models(result):
    _, r, _ = result
    assert r["missing"] == [], "our tensors the HF map does not write"
    assert r["unread"] == [], "HF tensors the map does not read"


def test_images_of_three_sizes_and_a_video_give_hf_logits(result):
    name, r, _ = result
    assert r["grid_thw"].tolist() == [[1, 4, 6], [1, 8, 4], [1, 6, 6]]
    assert r["image_tokens"] == (24 + 32 + 36) // 4 and r["video_tokens"] == 2 * 16 // 4
    positions = r["position_ids"]
    assert not torch.equal(positions[1], positions[2]), "the batch must exercise 2-D image positions"
    assert r["diff"] < MAX_ABS, r["diff"]
    assert r["blank_moves"] > 1e3 * MAX_ABS, "blank images must change the logits"
    if name == "qwen2.5-vl":
        assert r["windows"] == 2
        assert r["no_windows_moves"] > 1e3 * MAX_ABS, "window attention must matter in this batch"
    else:
        assert r["windows"] is None


def test_converter_round_trip(result):
    """The CLI's path: flags from config.json pick the preset's tower, the converted checkpoint gives HF's logits,
    and the way back writes every HF tensor bit-exactly under its name."""
    name, r, _ = result
    flags = r["flags"]
    assert flags[:4] == ["--model", name, "--model-size", "tiny"]
    assert flags[flags.index("--mrope-section") + 1:][:3] == ["2", "3", "3"]
    assert r["converted_diff"] < MAX_ABS, r["converted_diff"]
    assert r["round_trip_differs"] == []


@pytest.mark.parametrize("sp", [False, True], ids=["tp2", "tp2-sp"])
def test_tp2_gives_hf_logits(result, run_ranks, sp):
    """The converted checkpoint loaded under TP2 (both towers split: vision heads 4 -> 2 per rank, the merger's
    MLP column/row parallel), and with sequence parallelism (the merged sequence split over the 2 ranks)."""
    name, r, root = result
    flags = r["flags"] + FLAGS + ["--tensor-model-parallel-size", "2"] + (["--sequence-parallel"] if sp else [])
    logits = run_ranks(_tp_logits_worker, 2, "cpu", flags, str(root / "mcore"), r["batch"], timeout=240)[0]
    diff = (torch.as_tensor(logits) - r["hf_logits"]).abs().max().item()
    print(f"{name} tp2{' sp' if sp else ''}: max |logit diff| vs HF {diff:.2e}")
    assert diff < MAX_ABS, diff


def test_gradients_match_hf(result):
    """Backward through both towers: every parameter's gradient (mapped like its weight) within 1e-5 of its
    scale, the vision tower's included."""
    _, r, _ = result
    diffs = r["grad_diffs"]
    worst = max(diffs, key=lambda name: diffs[name][0] / max(diffs[name][1], 1e-12))
    print(f"worst gradient: {worst} {diffs[worst]}")
    assert diffs["vision_model.patch_embed.weight"][1] > 0
    assert all(diff <= MAX_ABS * max(1.0, scale) for diff, scale in diffs.values()), (worst, diffs[worst])


def _pp_losses_worker(rank, world_size, backend_name, flags, checkpoint, batch, labels):
    """Per-token losses of one micro-batch through megatron-core's pipeline schedule (forward only)."""
    from megatron.core import parallel_state
    from megatron.core.pipeline_parallel import get_forward_backward_func

    from helpers.hf_parity import converted_model

    _, model = converted_model(world_size, backend_name, flags, checkpoint)
    input_ids, position_ids, pixels = batch
    labels = torch.as_tensor(labels)

    def forward_step(_, chunk):
        output = chunk(input_ids, position_ids, None, labels=labels, **(pixels if chunk.add_encoder else {}))
        return output, lambda losses: (losses.float().mean(), {"token_losses": losses.detach()})

    out = get_forward_backward_func()(forward_step_func=forward_step, data_iterator=iter([None]), model=[model],
                                      num_microbatches=1, seq_length=input_ids.shape[1],
                                      micro_batch_size=input_ids.shape[0], forward_only=True)
    losses = out[0]["token_losses"] if parallel_state.is_pipeline_last_stage() else None
    return losses, model.vision_model is not None, len(model.language_model.decoder.layers)


def test_pp2_vision_on_the_first_stage_gives_the_same_losses(result, run_ranks):
    """PP2 with an uneven split (stage 0: the vision encoder + 1 language layer, stage 1: 3 layers): the per-token
    losses of the one-rank model."""
    name, r, root = result
    flags = r["flags"] + FLAGS + ["--pipeline-model-parallel-size", "2", "--decoder-first-pipeline-num-layers", "1"]
    first, last = run_ranks(_pp_losses_worker, 2, "cpu", flags, str(root / "mcore"), r["batch"], r["labels"],
                            timeout=240)
    assert first[1:] == (True, 1) and last[1:] == (False, 3), (first[1:], last[1:])
    diff = (torch.as_tensor(last[0]) - r["token_losses"]).abs().max().item()
    print(f"{name} pp2: max |per-token loss diff| vs one rank {diff:.2e}")
    assert diff < MAX_ABS, diff


def test_freeze_flags(result):
    """LLaVA's flags: --freeze-ViT the patch embedding and encoder layers, --freeze-projection the merger."""
    _, r, _ = result
    assert r["trainable"] == {"--freeze-ViT --freeze-projection": ["decoder", "embedding", "output_layer"],
                              "--freeze-LM --freeze-ViT": ["merger", "merger_norm"]}


def test_text_only_gives_hf_logits(result):
    _, r, _ = result
    assert r["text_diff"] < MAX_ABS, r["text_diff"]
    # and every encoder parameter a zero gradient (megatron-core's DDP waits for each one with overlapped reduce)
    assert r["text_only_encoder_grads"] and set(r["text_only_encoder_grads"]) == {0.0}


@pytest.mark.parametrize("flags, message", [
    (["--model", "llama3", "--position-embedding-type", "mrope"], "--position-embedding-type mrope: only the"),
    (["--model", "qwen2-vl", "--mrope-section", "2", "2", "2"], "--mrope-section 2 2 2: three sections"),
    (["--model", "qwen2-vl", "--position-embedding-type", "rope"], "--model qwen2-vl uses M-RoPE"),
    (["--model", "qwen2.5-vl", "--context-parallel-size", "2", "--sft"],
     "--context-parallel-size 2 with --model qwen2.5-vl --sft: text SFT of these models is not supported under CP"),
], ids=["mrope-on-text-model", "sections", "rope", "context-parallel"])
def test_flag_refusals(flags, message):
    from mtmegatron.convert.model import parse_flags
    from mtmegatron.utils.errors import ConfigError

    with pytest.raises(ConfigError, match=re.escape(message)):
        parse_flags(flags + FLAGS, world_size=2 if "--context-parallel-size" in flags else 1)


def test_conversion_refuses_a_tower_no_preset_has():
    from mtmegatron.models.families import ConversionError, get

    config = {"model_type": "qwen2_vl", "vocab_size": 1024, "hidden_size": 1536, "intermediate_size": 8960,
              "num_hidden_layers": 2, "num_attention_heads": 12, "num_key_value_heads": 2,
              "max_position_embeddings": 32768, "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
              "vision_config": {"depth": 24, "hidden_size": 1536}}
    with pytest.raises(ConversionError, match=re.escape("vision_num_layers 24 (preset tiny: 2)")):
        get("qwen2-vl").flags_from_hf(config)
    config["vision_config"]["depth"] = 32  # the released tower: the 2b preset's, whatever the language depth
    flags = get("qwen2-vl").flags_from_hf(config)
    assert flags[:4] == ["--model", "qwen2-vl", "--model-size", "2b"]
    assert flags[flags.index("--num-layers") + 1] == "2"


PRESETS = [("qwen2-vl", s) for s in ("tiny", "2b", "7b")] + [("qwen2.5-vl", s) for s in ("tiny", "3b", "7b")]


@pytest.mark.parametrize("family_name, size", PRESETS, ids=[f"{f}-{s}" for f, s in PRESETS])
def test_every_preset_survives_its_hf_config(family_name, size):
    """preset -> hf_config -> flags_from_hf -> the same model flags (and the same preset named)."""
    from mtmegatron.convert.model import parse_flags
    from mtmegatron.models.families import get
    from mtmegatron.models.fingerprint import fingerprint

    family = get(family_name)
    args = parse_flags(["--model", family_name, "--model-size", size, *FLAGS])
    flags = family.flags_from_hf(family.hf_config(args))
    back = parse_flags(flags + FLAGS)
    assert flags[3] == size
    assert fingerprint(back) == fingerprint(args)
    assert {k: getattr(back, k) for k in family.presets[size]} == {k: getattr(args, k) for k in family.presets[size]}


if __name__ == "__main__":
    torch.save(_worker(*sys.argv[2:5]), sys.argv[1])
