"""``--model qwen2-vl`` / ``qwen2.5-vl`` (tiny presets; Qwen2.5-VL with a tower no preset has, ``TOWERS``) against HF
transformers' ``Qwen2VLForConditionalGeneration`` / ``Qwen2_5_VLForConditionalGeneration`` at one rank, cpu backend,
fp32.

One worker process per family builds our model from the preset and flags, builds the HF model from the family's ``hf_config`` (random
init, every tensor then perturbed so that no norm is the identity and no bias zero), loads our model through the
family's ``hf_map`` from the tensors ``save_pretrained`` wrote (the converter's one table: every mcore tensor
written, every HF tensor read), and runs one batch through both:
* two samples, three images of three sizes (grid_thw 1x4x6, 1x8x4 and 1x6x6 patches) made by HF's
  ``Qwen2VLImageProcessorPil`` from PIL images and one video (2 temporal patches of 4x4: its slabs attend each to
  itself); sample 0 holds two images, sample 1 an image and the video; the 3-D position ids from HF's
  ``get_rope_index`` are the input of both models;
* logits at every position within 1e-5 (measured: Qwen2-VL 3.0e-6, Qwen2.5-VL 3.6e-6, on logits up to
  2.8; TP2 and TP2+SP 3.1e-6 for both with the preset towers; float summation order only);
* the images matter: the same batch with blank images moves our logits by far more than the tolerance;
* text only (2-D positions): the same logits as HF's text path, and a zero gradient for every encoder parameter;
* backward: the gradient of one random projection of the logits, every HF parameter's mapped like its weight,
  within 1e-5 of the gradient's scale for every parameter of both towers (measured: 2.1e-6 relative at worst);
* Qwen2.5-VL: a 3-layer ViT (no preset's: ``--vision-num-layers 3 --vision-window-size 84
  --vision-full-attention-layers 0 2 --vision-tokens-per-second 4``) attends in windows of 3x3 merge blocks in
  layer 1, so the 8x4-patch image makes 2 windows (one cut at the edge); the same model without windows gives other
  logits;
* the converter: HF ``save_pretrained`` -> ``hf_to_mcore`` (every flag from config.json, the tower's included, no
  preset named) -> our model loaded from the checkpoint gives HF's logits, at one rank and under TP2 with and
  without sequence parallelism (2 spawned ranks); ``mcore_to_hf`` writes the same tensors back bit-exactly and a
  config.json whose every value transformers reads is the original's (``tokens_per_second`` 4 and the text
  config's bos 3 / eos 2, which no flag holds, included);
* a video record (4 frames at 1 fps) made into a sample by the training data pipeline with the converted flags:
  our loss on its answer equals HF's (measured equal to 7 digits; with the video at the old hard-coded 2 tokens
  per second, 1.2e-3 off);
* damaged inputs through ``mtmegatron convert``: a ``.distcp`` file or the ``.metadata`` cut in half (qwen2-vl's
  worker), a ``.distcp`` file zero-filled (qwen2.5-vl's), a safetensors file short of its last 64 bytes: exit 2
  and one line naming the file;
* ``--freeze-LM`` / ``--freeze-ViT`` / ``--freeze-projection`` leave the rest trainable;
* pipeline: PP2 with the vision encoder and 1 language layer on stage 0, 3 layers on stage 1, through
  megatron-core's schedule: the one-rank per-token losses (measured 1.9e-6 on losses of ~7).
Refusals: HF vision fields the tower cannot take (one line naming the field) and tower flags a family cannot take.
Cost: each worker ~11 s of CPU (user + sys, its forked converter workers included); the 3-layer tower, the video
record, the config round trip and the damaged-input cases added 0.1 s of it (Qwen2.5-VL, measured back to back:
10.72 / 10.71 s before, 10.80 / 10.88 s after); the whole module 144 s wall at load average 12 on the shared box.
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
# the Qwen2.5-VL tower is no preset's: 3 layers, windows of 3x3 merge blocks, full attention in layers 0 and 2,
# 4 temporal positions per second of video (the released checkpoints' 2, the tiny preset's 2 layers / 56 / [1])
TOWERS = {"qwen2-vl": [], "qwen2.5-vl": ["--vision-num-layers", "3", "--vision-window-size", "84",
                                        "--vision-full-attention-layers", "0", "2", "--vision-tokens-per-second", "4"]}
CARRIED = {"bos_token_id": 3, "eos_token_id": 2}  # not transformers' defaults (151643 / 151645)


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

    from mtmegatron.convert.model import build_model, init_single_rank, hf_inputs, parse_flags
    from mtmegatron.models import families

    args = parse_flags(["--model", family_name, "--model-size", "tiny", *TOWERS[family_name], *FLAGS])
    init_single_rank(args)
    model = build_model(args).eval()
    family = families.get(family_name)
    trainable = {}  # LLaVA's freeze flags on this model: the names of what still trains
    for freeze in (["--freeze-ViT", "--freeze-projection"], ["--freeze-LM", "--freeze-ViT"]):
        frozen = build_model(parse_flags(["--model", family_name, "--model-size", "tiny", *FLAGS, *freeze]))
        trainable[" ".join(freeze)] = sorted({n.split(".")[1] for n, p in frozen.named_parameters() if p.requires_grad})

    config = transformers.AutoConfig.for_model(**family.hf_config(**hf_inputs(args), record=CARRIED))
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
        for entry in family.hf_map(**hf_inputs(args)):
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
    converted = _through_the_converter(root, family, (input_ids, position_ids, pixels), hf)
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
            "config_differs": converted["config_differs"], "back_config": converted["back_config"],
            "video_record": converted["video_record"], "damaged": converted["damaged"],
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
    from mtmegatron.convert.model import hf_inputs

    input_ids, position_ids, pixels, token_type = batch
    weights = torch.randn(*input_ids.shape, args.vocab_size, generator=torch.Generator().manual_seed(2))
    (model(input_ids, position_ids, None, **pixels)[..., : args.vocab_size] * weights).sum().backward()
    (hf(input_ids=input_ids, position_ids=position_ids, mm_token_type_ids=token_type, **pixels).logits
     * weights).sum().backward()
    hf_grads = {name: p.grad for name, p in hf.named_parameters()}
    ours = dict(model.named_parameters())
    diffs = {}
    for entry in family.hf_map(**hf_inputs(args)):
        if entry.to_mcore is not None:
            expected = entry.to_mcore(*(hf_grads[_memory_name(n)] for n in entry.hf))
            got = ours[entry.mcore].main_grad if ours[entry.mcore].grad is None else ours[entry.mcore].grad
            diffs[entry.mcore] = ((got - expected).abs().max().item(), expected.abs().max().item())
    return diffs


def _through_the_converter(root, family, batch, hf):
    """``hf_to_mcore`` of the saved HF model (flags from its config.json), our model built from those flags and
    loaded from the checkpoint, its logits on ``batch`` and its loss on a video record; ``mcore_to_hf`` back: the
    HF tensors and config values that differ; then damaged copies of the inputs through the command line."""
    import json

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
    video_record = _video_record_losses(root, family.name, flags, model, hf)
    parallel_state.destroy_model_parallel()
    mcore_to_hf(f"{root}/mcore", f"{root}/back")
    before, after = load_file(f"{root}/hf/model.safetensors"), load_file(f"{root}/back/model.safetensors")
    differs = sorted(n for n in set(before) | set(after) if n not in before or n not in after
                     or not torch.equal(before[n], after[n]))
    damaged = _damaged_inputs(root, family.name)
    with open(f"{root}/back/config.json") as f:
        back_config = json.load(f)
    return {"logits": logits, "flags": flags, "round_trip_differs": differs, "video_record": video_record,
            "config_differs": _config_differences(f"{root}/hf", f"{root}/back"), "back_config": back_config,
            "damaged": damaged}


def _config_differences(original: str, back: str) -> list[str]:
    """``section.field: original != back`` for every value transformers reads from either config.json (its
    config classes' ``to_dict``, defaults filled in) that differs; the version and dtype stamps aside."""
    import transformers

    ignored = {"transformers_version", "dtype", "torch_dtype", "_name_or_path", "architectures"}
    configs = [transformers.AutoConfig.from_pretrained(path).to_dict() for path in (original, back)]
    out = []
    for section in ("text_config", "vision_config", None):
        a, b = (c[section] if section else c for c in configs)
        for field in sorted(set(a) | set(b)):
            if field not in ignored and field not in ("text_config", "vision_config") and a.get(field) != b.get(field):
                out.append(f"{section or 'top'}.{field}: {a.get(field)!r} != {b.get(field)!r}")
    return out


def _video_record_losses(root, family_name, flags, model, hf) -> dict:
    """A video conversation (4 frames of 56x56 at 1 frame per second: 2 frame groups of 2 seconds) made into a
    training sample by the data pipeline with the converted checkpoint's flags (tasks/qwen_vl/data.py's
    ``data_config``: its video time positions), through our model; and through HF's, which positions the video
    with its own config's ``tokens_per_second`` and the sample's ``second_per_grid_ts``: the mean loss over the
    answer tokens of both, and ours with the video placed at 2 positions per second instead (the time positions
    must matter in this record)."""
    import dataclasses
    import json

    import numpy as np
    import torch.nn.functional as F
    from PIL import Image

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "generate"))
    from qwen_vl_reference import save_vision_tokenizer

    from mtmegatron.convert.model import parse_flags
    from mtmegatron.data.vision.mrope_positions import rope_index, token_types
    from mtmegatron.data.vision.qwen_vl_samples import load_vision_conversations
    from mtmegatron.data.tokenizer import load_tokenizer
    from mtmegatron.tasks.qwen_vl.data import data_config

    save_vision_tokenizer(f"{root}/tokenizer")
    rng = np.random.default_rng(4)
    os.makedirs(f"{root}/frames")
    for i in range(4):
        Image.fromarray(rng.integers(0, 256, (56, 56, 3), dtype=np.uint8)).save(f"{root}/frames/f{i}.png")
    turns = [{"from": "human", "value": "<video>\nWhat happens?"}, {"from": "gpt", "value": "Noise moves on."}]
    with open(f"{root}/video.jsonl", "w") as f:
        f.write(json.dumps({"id": "v", "video": "frames", "fps": 1.0, "conversations": turns}) + "\n")
    args = parse_flags(flags + FLAGS)
    config = data_config(args)
    config = dataclasses.replace(config, seq_length=512, video=dataclasses.replace(
        config.video, min_pixels=56 * 56, max_pixels=56 * 56))  # each frame as it is: 4x4 patches
    sample = load_vision_conversations([f"{root}/video.jsonl"], root, load_tokenizer(f"{root}/tokenizer"),
                                       config)[0]
    tokens, labels, mask = sample["tokens"][None], sample["labels"][None], sample["loss_mask"][None]
    video = {"pixel_values_videos": sample["pixel_values_videos"], "video_grid_thw": sample["video_grid_thw"]}
    types = token_types(tokens, args.image_token_id, args.video_token_id)
    timed = {"second_per_grid_ts": sample["second_per_grid_ts"]} if args.vision_tokens_per_second else {}
    other, _ = rope_index(types, video_grid_thw=sample["video_grid_thw"], merge_size=args.vision_spatial_merge_size,
                          tokens_per_second=2 if args.vision_tokens_per_second != 2 else 3,
                          second_per_grid_ts=sample["second_per_grid_ts"])
    targets = labels.clamp(min=0)  # masked out below

    def mean(losses):
        return ((losses.float() * mask).sum() / mask.sum()).item()

    with torch.no_grad():
        hf_logits = hf(input_ids=tokens, mm_token_type_ids=types, **video, **timed).logits
        hf_loss = mean(F.cross_entropy(hf_logits[0], targets[0], reduction="none")[None])
        ours = mean(model(tokens, sample["position_ids"][:, None], None, labels=targets, **video))
        elsewhere = mean(model(tokens, other, None, labels=targets, **video))
    return {"hf": hf_loss, "ours": ours, "other_positions": elsewhere, "grid": sample["video_grid_thw"].tolist(),
            "seconds": sample["second_per_grid_ts"].tolist(), "tokens_per_second": args.vision_tokens_per_second}


def _cli(argv: list[str]) -> tuple[int, str]:
    """``mtmegatron.cli.main(argv)``: its status and everything written on file descriptor 2 (the converter's
    worker processes' included)."""
    import tempfile

    from megatron.core import parallel_state

    from mtmegatron import cli

    parallel_state.destroy_model_parallel()
    with tempfile.TemporaryFile() as err:
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(err.fileno(), 2)
        try:
            status = cli.main(argv)
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
        err.seek(0)
        return status, err.read().decode(errors="replace")


def _damaged_inputs(root, family_name) -> dict:
    """The command line on damaged copies: mcore-to-hf of the converted checkpoint with its largest ``.distcp``
    file cut in half (qwen2-vl; its ``.metadata`` cut in half too) or zero-filled (qwen2.5-vl), hf-to-mcore with the
    safetensors file's last 64 bytes cut off: {case: (status, stderr, the damaged file, what is left of --out)}."""
    import glob
    import shutil

    out = {}
    shutil.copytree(f"{root}/mcore", f"{root}/damaged")
    shard = max(glob.glob(f"{root}/damaged/iter_*/*.distcp"), key=os.path.getsize)
    size = os.path.getsize(shard)
    if family_name == "qwen2-vl":
        os.truncate(shard, size // 2)
    else:
        with open(shard, "r+b") as f:
            f.write(bytes(size))
    case = "distcp_truncated" if family_name == "qwen2-vl" else "distcp_zero_filled"
    status, err = _cli(["convert", "mcore-to-hf", "--load", f"{root}/damaged", "--out", f"{root}/damaged_hf"])
    out[case] = (status, err, shard, glob.glob(f"{root}/damaged_hf*"))
    if family_name == "qwen2-vl":  # and its .metadata cut short
        shutil.copytree(f"{root}/mcore", f"{root}/damaged_index")
        index = glob.glob(f"{root}/damaged_index/iter_*/.metadata")[0]
        os.truncate(index, os.path.getsize(index) // 2)
        status, err = _cli(["convert", "mcore-to-hf", "--load", f"{root}/damaged_index", "--out", f"{root}/index_hf"])
        out["metadata_truncated"] = (status, err, index, glob.glob(f"{root}/index_hf*"))
    shutil.copytree(f"{root}/hf", f"{root}/damaged_st")
    file = f"{root}/damaged_st/model.safetensors"
    os.truncate(file, os.path.getsize(file) - 64)
    status, err = _cli(["convert", "hf-to-mcore", "--model", family_name, "--hf-dir", f"{root}/damaged_st", "--out",
                        f"{root}/damaged_mcore"])
    out["safetensors_truncated"] = (status, err, file, glob.glob(f"{root}/damaged_mcore*"))
    return out


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
        assert r["windows"] == 3  # 84 pixels: 3x3 merge blocks (the 8x4-patch image: a window and a cut one)
        assert r["no_windows_moves"] > 1e3 * MAX_ABS, "window attention must matter in this batch"
    else:
        assert r["windows"] is None


def test_converter_round_trip(result):
    """The CLI's path: flags from config.json, every value explicit (Qwen2.5-VL's tower is no preset's: 3 layers,
    another window and full-attention set, 4 tokens per second); the converted checkpoint gives HF's logits, and
    the way back writes every HF tensor bit-exactly under its name and every config value transformers reads as it
    was (tokens_per_second and the text config's bos/eos ids included)."""
    name, r, _ = result
    flags = r["flags"]
    assert flags[:2] == ["--model", name] and "--model-size" not in flags
    assert flags[flags.index("--mrope-section") + 1:][:3] == ["2", "3", "3"]
    assert flags[flags.index("--image-token-id") + 1] == "1020"
    if name == "qwen2.5-vl":
        for flag, values in (("--vision-num-layers", ["3"]), ("--vision-window-size", ["84"]),
                             ("--vision-full-attention-layers", ["0", "2"]), ("--vision-tokens-per-second", ["4"])):
            assert flags[flags.index(flag) + 1:][:len(values)] == values, flag
        assert r["back_config"]["vision_config"]["tokens_per_second"] == 4
    assert r["converted_diff"] < MAX_ABS, r["converted_diff"]
    assert r["round_trip_differs"] == []
    assert {k: r["back_config"]["text_config"].get(k) for k in CARRIED} == CARRIED
    assert r["config_differs"] == []


def test_video_record_gives_hf_loss(result):
    """A video conversation made into a sample by the training data pipeline with the converted checkpoint's
    flags: our loss on its answer is HF's (HF positions the video by its own config: Qwen2.5-VL 4 tokens per second
    here, 2 frame groups of 2 seconds: temporal positions 0 and 8; Qwen2-VL one step per group); the same sample
    with the video placed at another rate moves the loss by far more than the tolerance."""
    name, r, _ = result
    v = r["video_record"]
    print(name, v)
    assert v["grid"] == [[2, 4, 4]] and v["seconds"] == [2.0]
    assert v["tokens_per_second"] == (4 if name == "qwen2.5-vl" else None)
    assert abs(v["ours"] - v["hf"]) < MAX_ABS, v
    assert abs(v["other_positions"] - v["hf"]) > 20 * MAX_ABS, v  # measured: 1.2e-3 (qwen2.5-vl, rate 2)


def test_a_damaged_input_file_is_one_line_naming_it(result):
    """``convert mcore-to-hf`` with a ``.distcp`` file cut in half or a ``.metadata`` cut in half (qwen2-vl's run) or
    a ``.distcp`` file zero-filled (qwen2.5-vl's), ``convert hf-to-mcore`` with a truncated safetensors file: exit 2,
    the whole of stderr one line naming the file (no worker traceback), nothing left under --out."""
    name, r, _ = result
    assert len(r["damaged"]) == (3 if name == "qwen2-vl" else 2)
    for case, (status, err, path, left) in r["damaged"].items():
        assert status == 2 and err.count("\n") == 1 and err.startswith("mtmegatron: error: "), (case, err)
        assert path in err and "Traceback" not in err, (case, err)
        assert left == [], (case, left)


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


QWEN2_VL_CONFIG = {"model_type": "qwen2_vl", "vocab_size": 1024, "hidden_size": 1536, "intermediate_size": 8960,
                   "num_hidden_layers": 2, "num_attention_heads": 12, "num_key_value_heads": 2,
                   "max_position_embeddings": 32768, "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
                   "vision_config": {"depth": 24, "hidden_size": 1536}}


def test_a_tower_no_preset_has_converts_with_its_own_flags():
    """Every vision field becomes a flag (transformers' defaults where absent): no preset is looked for."""
    from mtmegatron.convert.model import hf_inputs, parse_flags
    from mtmegatron.models.families import get

    flags = get("qwen2-vl").flags_from_hf(QWEN2_VL_CONFIG)
    args = parse_flags(flags + FLAGS)
    assert (args.vision_num_layers, args.vision_hidden_size, args.vision_ffn_hidden_size, args.num_layers) == (
        24, 1280, 5120, 2)
    config = {**QWEN2_VL_CONFIG, "model_type": "qwen2_5_vl", "vision_config": {
        "depth": 3, "hidden_size": 64, "intermediate_size": 80, "num_heads": 2, "window_size": 56,
        "fullatt_block_indexes": [], "out_hidden_size": 1536, "patch_size": 7, "temporal_patch_size": 1,
        "spatial_merge_size": 4}}
    args = parse_flags(get("qwen2.5-vl").flags_from_hf(config) + FLAGS)
    assert (args.vision_num_layers, args.vision_hidden_size, args.vision_ffn_hidden_size,
            args.vision_num_attention_heads, args.vision_window_size, args.vision_full_attention_layers,
            args.patch_dim, args.vision_temporal_patch_size, args.vision_spatial_merge_size,
            args.vision_tokens_per_second) == (3, 64, 80, 2, 56, [], 7, 1, 4, 4)  # tokens_per_second: HF's default
    back = get("qwen2.5-vl").hf_config(**hf_inputs(args))["vision_config"]
    assert {k: back[k] for k in config["vision_config"]} == config["vision_config"]


@pytest.mark.parametrize("model_type, vision, message", [
    ("qwen2_vl", {"hidden_act": "gelu"}, "vision_config.hidden_act 'gelu'"),
    ("qwen2_vl", {"in_chans": 1}, "vision_config.in_channels 1"),
    ("qwen2_vl", {"rope_parameters": {"rope_type": "axial", "rope_theta": 500.0}}, "vision_config.rope_parameters"),
    ("qwen2_vl", {"mlp_ratio": 2.5}, "vision_config.mlp_ratio 2.5"),
    ("qwen2_vl", {"hidden_size": 1024}, "vision_config.hidden_size 1024 (the merger's output)"),
    ("qwen2_vl", {"embed_dim": 72, "num_heads": 4}, "the vision head dim must be a whole multiple of 4"),
    ("qwen2_5_vl", {"tokens_per_second": 0}, "vision_config.tokens_per_second 0"),
    ("qwen2_5_vl", {"patch_size": [14, 14]}, "vision_config.patch_size [14, 14]"),
    ("qwen2_5_vl", {"window_size": 14}, "vision_config.window_size 14"),
    ("qwen2_5_vl", {"fullatt_block_indexes": 3}, "vision_config.fullatt_block_indexes 3"),
    ("qwen2_5_vl", {"out_hidden_size": 3584}, "vision_config.out_hidden_size 3584"),
], ids=["hidden-act", "in-chans", "rope-theta", "mlp-ratio", "merger-out", "head-dim", "tokens-per-second",
        "patch-size-list", "window", "full-attention-not-a-list", "out-hidden-size"])
def test_a_vision_field_the_tower_cannot_take_is_refused_naming_it(model_type, vision, message):
    from mtmegatron.models.families import ConversionError, by_hf_model_type

    config = {**QWEN2_VL_CONFIG, "model_type": model_type,
              "vision_config": {"hidden_size": 1536, "out_hidden_size": 1536, **vision}}
    with pytest.raises(ConversionError, match=re.escape(message)):
        by_hf_model_type(model_type).flags_from_hf(config)


@pytest.mark.parametrize("flags, message", [
    (["--model", "qwen2-vl", "--vision-window-size", "56"], "--vision-window-size: --model qwen2-vl's vision tower"),
    (["--model", "qwen2-vl", "--vision-tokens-per-second", "2"], "--vision-tokens-per-second: --model qwen2-vl's"),
    (["--model", "llama3", "--vision-temporal-patch-size", "2"], "--vision-temporal-patch-size: only the native"),
    (["--model", "qwen2.5-vl", "--vision-hidden-size", "72"], "the vision head dim must be a whole multiple of 4"),
    (["--model", "qwen2.5-vl", "--vision-window-size", "14"], "--vision-window-size 14: at least one 28x28"),
    (["--model", "qwen2.5-vl", "--vision-full-attention-layers", "-1"], "layer indexes count from 0"),
], ids=["window-on-qwen2-vl", "tokens-per-second-on-qwen2-vl", "tower-on-llama3", "head-dim", "window", "negative"])
def test_tower_flag_refusals(flags, message):
    from mtmegatron.convert.model import parse_flags
    from mtmegatron.utils.errors import ConfigError

    with pytest.raises(ConfigError, match=re.escape(message)):
        parse_flags(flags + FLAGS)


PRESETS = [("qwen2-vl", s) for s in ("tiny", "2b", "7b")] + [("qwen2.5-vl", s) for s in ("tiny", "3b", "7b")]


@pytest.mark.parametrize("family_name, size", PRESETS, ids=[f"{f}-{s}" for f, s in PRESETS])
def test_every_preset_survives_its_hf_config(family_name, size):
    """preset -> hf_config -> flags_from_hf -> the same model flags (and the same preset named)."""
    from mtmegatron.convert.model import hf_inputs, parse_flags
    from mtmegatron.models.families import get
    from mtmegatron.models.fingerprint import fingerprint

    family = get(family_name)
    args = parse_flags(["--model", family_name, "--model-size", size, *FLAGS])
    flags = family.flags_from_hf(family.hf_config(**hf_inputs(args)))
    back = parse_flags(flags + FLAGS)
    assert "--model-size" not in flags  # every value explicit: the tiny preset underneath gives nothing
    assert fingerprint(back) == fingerprint(args)
    assert {k: getattr(back, k) for k in family.presets[size]} == {k: getattr(args, k) for k in family.presets[size]}


if __name__ == "__main__":
    torch.save(_worker(*sys.argv[2:5]), sys.argv[1])
