"""``mtmegatron generate --image`` on the tiny Qwen2-VL and Qwen2.5-VL against HF transformers' own greedy
``generate`` (the reference nobody here wrote).

One subprocess (qwen_vl_reference.py) saves, per family, a random tiny HF model (perturbed: no identity norm, no
zero bias) and converts it with ``hf_to_mcore``, a tokenizer with the presets' special-token ids, two images of
different sizes (4x6 and 8x4 patches), and HF ``generate(do_sample=False)``'s tokens for two image prompts and one
text prompt, each alone. Our side loads the converted checkpoint as ``mtmegatron generate`` does and decodes both
image prompts as one static batch:
- prompt ids equal HF's rendering (chat template + the processor's pad expansion);
- KV cache (megatron-core's static engine, tasks/qwen_vl/generate_engine.py): HF's 16 greedy tokens for both prompts;
  the second prompt is the longer and its second image lies past the first prompt's end, so its embeddings are
  merged in decode steps, not the prefill; the cache-free loop (tasks/qwen_vl/generate_recompute.py) gives the same;
  a text prompt to the same model: HF's tokens too;
- the test can see what it checks: decoding with text positions after the prompt (no ``rope_delta``) or with
  blank images gives other tokens; sampling follows ``--seed``;
- TP2 (Qwen2.5-VL: windowed vision attention, both towers split) and PP2 (Qwen2-VL, the tower on stage 0): HF's
  greedy tokens on both ranks, image and text prompts;
- the CLI (Qwen2-VL): the same tokens in --output, the KV-cache engine named in the report line;
- ``--max-pixels`` resizes the images as HF's processor would (fewer image tokens);
- bad input, one line and exit 2 before any process group: a missing image, a corrupt one, an image for a text
  model, ``<image>`` tags that do not match the images, --min-pixels over --max-pixels.
Cost: ~23 s of CPU (user + sys of the whole run: one reference subprocess, two one-rank workers, a TP2 and a PP2
pair, one CLI run); wall 78 s with the 2 cores shared at load average ~8 (233 s at 19).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.child_path import with_tests_on_path
from helpers.cli_subprocess import ENV, run_cli
from qwen_vl_reference import FAMILIES, PROMPTS, TEXT_PROMPT

HERE = Path(__file__).parent

NEW_TOKENS = 16
_ONE_RANK: dict = {}


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """ROOT of qwen_vl_reference.py's output (both families, the text model), made once."""
    root = tmp_path_factory.mktemp("qwen_vl_generate")
    proc = subprocess.run([sys.executable, str(HERE / "qwen_vl_reference.py"), str(root), str(NEW_TOKENS)],
                          capture_output=True, text=True, env=with_tests_on_path(ENV), timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return root


def converted(made: Path, name: str):
    """(ROOT, the family's checkpoint directory, HF's reference)."""
    reference = json.loads((made / name / "reference.json").read_text())
    assert all(len(t) >= 8 for t in reference["tokens"] + [reference["text"]["tokens"]]), reference
    assert reference["grids"] == [[1, 4, 6], [1, 8, 4]]
    return made, made / name / "mcore", reference


def _argv(root: Path, load: Path, prompts: list[str], *extra: str) -> list[str]:
    return ["--backend", "cpu", "--load", str(load), "--tokenizer-model", str(root / "tokenizer"),
            "--max-new-tokens", str(NEW_TOKENS), "--image", str(root / "a.png"), "--image", str(root / "b.png"),
            *[a for p in prompts for a in ("--prompt", p)], *extra]


def _generate_worker(rank, world_size, backend_name, root, load, layout, greedy_only=False):
    """One rank: the model loaded as ``mtmegatron generate`` loads it, then generations from it."""
    import argparse

    import torch

    import mtmegatron
    import mtmegatron.tasks.qwen_vl.generate_prompts as vision_prompts_module
    from mtmegatron.backends import get_backend
    from mtmegatron.generate.command import prepare
    from mtmegatron.config.generate_flags import add_generate_args
    from mtmegatron.tasks.qwen_vl.generate_images import vision_prompts
    from mtmegatron.generate.model import build_and_load
    from mtmegatron.inference.engine import Sampling
    from mtmegatron.tasks.qwen_vl.generate_engine import generate_with_images
    from mtmegatron.tasks.qwen_vl.generate_prompts import VisionPrompt
    from mtmegatron.tasks.qwen_vl.generate_recompute import generate_with_images_without_cache
    from mtmegatron.training.setup import init_distributed

    args = add_generate_args(argparse.ArgumentParser()).parse_args(_argv(Path(root), Path(load), PROMPTS, *layout))
    _, prompts, prompt_tokens, tokenizer, margs, common = prepare(args)
    prompt_tokens, visions = vision_prompts(args, prompts, prompt_tokens, tokenizer, margs)
    args.image, args.prompt = None, [TEXT_PROMPT]  # a text prompt to the same model
    _, text_prompts, text_tokens, _, _, _ = prepare(args)
    text_tokens, text_visions = vision_prompts(args, text_prompts, text_tokens, tokenizer, margs)
    mtmegatron.activate(get_backend(backend_name))
    init_distributed(margs, get_backend(backend_name))
    model = build_and_load(margs, common["directory"])

    def tokens(visions=visions, prompts=prompts, prompt_tokens=prompt_tokens, **sampling):
        results, _ = generate_with_images(model, tokenizer, prompts, prompt_tokens, visions,
                                          Sampling(NEW_TOKENS, **sampling))
        return [r.tokens for r in results]

    out = {"prompt_tokens": prompt_tokens, "greedy": tokens(),
           "text": {"prompt_tokens": text_tokens[0], "tokens": tokens(text_visions, text_prompts, text_tokens)[0]}}
    if greedy_only:
        return json.dumps(out)
    out["recompute"] = [r.tokens for r in generate_with_images_without_cache(
        model, tokenizer, prompts, prompt_tokens, visions, NEW_TOKENS)[0]]
    out["sampled"] = tokens(top_k=4, temperature=1.0, seed=7)
    out["sampled_again"] = tokens(top_k=4, temperature=1.0, seed=7)
    blank = [VisionPrompt(v.positions, torch.zeros_like(v.pixel_values), v.image_grid_thw) for v in visions]
    out["blank_images"] = tokens(blank)
    with_delta = vision_prompts_module.continued_positions

    def text_positions_after_the_prompt(positions, length):
        continued = with_delta(positions, length)
        continued[:, positions.shape[1]:] = torch.arange(positions.shape[1], length)
        return continued

    vision_prompts_module.continued_positions = text_positions_after_the_prompt
    out["no_rope_delta"] = tokens()
    vision_prompts_module.continued_positions = with_delta
    return json.dumps(out)


@pytest.fixture
def one_rank(made, run_ranks):
    """name -> the one-rank results of that family (computed once per family)."""

    def results(name: str):
        if name not in _ONE_RANK:
            root, load, _ = converted(made, name)
            (result,) = run_ranks(_generate_worker, 1, "cpu", str(root), str(load), [], timeout=300)
            _ONE_RANK[name] = json.loads(result)
        return _ONE_RANK[name]

    return results


@pytest.mark.parametrize("name", list(FAMILIES))
def test_greedy_with_images_equals_hf_generate(name, made, one_rank):
    _, _, reference = converted(made, name)
    ours = one_rank(name)
    assert ours["prompt_tokens"] == reference["prompt_tokens"], "the chat template / pad expansion differ from HF's"
    assert ours["greedy"] == reference["tokens"], "KV-cache engine vs HF generate"
    assert ours["recompute"] == reference["tokens"], "full recompute vs HF generate"


@pytest.mark.parametrize("name", list(FAMILIES))
def test_text_prompt_equals_hf_generate(name, made, one_rank):
    """No image: the same KV-cache path with text positions (megatron-core's plain wrapper fails on M-RoPE at the
    first decode step: its rotary table covers only the step's window)."""
    _, _, reference = converted(made, name)
    assert one_rank(name)["text"] == reference["text"]


@pytest.mark.parametrize("name", list(FAMILIES))
def test_decode_positions_and_images_matter(name, made, one_rank):
    """Without HF's rope_delta after the prompt, or with blank images, the tokens differ: the comparison above sees
    both; and sampling (the controller's) follows the seed."""
    _, _, reference = converted(made, name)
    ours = one_rank(name)
    assert ours["no_rope_delta"] != reference["tokens"]
    assert ours["blank_images"] != reference["tokens"]
    assert ours["sampled"] == ours["sampled_again"] != ours["greedy"]


@pytest.mark.parametrize("name, layout", [("qwen2.5-vl", ["--tensor-model-parallel-size", "2"]),
                                          ("qwen2-vl", ["--pipeline-model-parallel-size", "2"])],
                         ids=["qwen2.5-vl-tp2", "qwen2-vl-pp2"])
def test_tp2_pp2_generate_hf_tokens(name, layout, made, run_ranks):
    """TP2: both towers split (Qwen2.5-VL's windowed ViT heads 4 -> 2 per rank); PP2: the vision tower and 2
    language layers on stage 0, the positions on both stages."""
    root, load, reference = converted(made, name)
    ranks = [json.loads(r) for r in run_ranks(_generate_worker, 2, "cpu", str(root), str(load), layout, True,
                                              timeout=300)]
    assert [r["greedy"] for r in ranks] == [reference["tokens"]] * 2
    assert [r["text"] for r in ranks] == [reference["text"]] * 2


def test_cli_writes_hf_tokens(made, tmp_path):
    root, load, reference = converted(made, "qwen2-vl")
    out = tmp_path / "out.jsonl"
    proc = run_cli("generate", *_argv(root, load, PROMPTS, "--output", str(out)))
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["tokens"] for r in rows] == reference["tokens"]
    assert [r["prompt_tokens"] for r in rows] == reference["prompt_tokens"]
    assert "greedy" in proc.stdout and "KV cache" in proc.stdout


def test_pixel_bounds_resize_the_images(made):
    """--max-pixels 3136 (56x56): HF's rule shrinks 84x56 to 56x28 and 56x112 to 28x56, 2 merged tokens each."""
    import argparse

    from mtmegatron.generate.command import prepare
    from mtmegatron.config.generate_flags import add_generate_args
    from mtmegatron.tasks.qwen_vl.generate_images import vision_prompts

    root, load, reference = converted(made, "qwen2-vl")
    args = add_generate_args(argparse.ArgumentParser()).parse_args(_argv(root, load, PROMPTS[:1], "--max-pixels", "3136"))
    _, prompts, prompt_tokens, tokenizer, margs, _ = prepare(args)
    prompt_tokens, visions = vision_prompts(args, prompts, prompt_tokens, tokenizer, margs)
    assert visions[0].image_grid_thw.tolist() == [[1, 2, 4], [1, 4, 2]]
    assert len(prompt_tokens[0]) == len(reference["prompt_tokens"][0]) - (6 + 8) + (2 + 2)


def _cli_error(capsys, *argv) -> str:
    import torch

    from mtmegatron.cli import main

    assert main(["generate", *argv]) == 2
    assert not torch.distributed.is_initialized()
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


def test_bad_images_are_one_line(made, tmp_path, capsys):
    root, load, _ = converted(made, "qwen2-vl")
    base = ["--backend", "cpu", "--load", str(load), "--tokenizer-model", str(root / "tokenizer")]
    missing = tmp_path / "missing.png"
    err = _cli_error(capsys, *base, "--image", str(missing), "--prompt", "Hi")
    assert f"--image {missing}: no such file" in err
    corrupt = tmp_path / "corrupt.png"
    corrupt.write_bytes((root / "a.png").read_bytes()[:60])  # a truncated PNG
    err = _cli_error(capsys, *base, "--image", str(corrupt), "--prompt", "Hi")
    assert f"--image {corrupt}: cannot read it as an image" in err
    err = _cli_error(capsys, *base, "--image", str(root / "a.png"), "--prompt", "<image> and <image>")
    assert "prompt 1: 2 <image> tag(s) but 1 image(s) (the --image files)" in err
    err = _cli_error(capsys, *base, "--image", str(root / "a.png"), "--prompt", "Hi <|video_pad|>")
    assert "prompt 1: its text holds <|video_pad|> but no video is given" in err
    err = _cli_error(capsys, *base, "--image", str(root / "a.png"), "--prompt", "Hi", "--min-pixels", "5000",
                     "--max-pixels", "4000")
    assert "--min-pixels 5000 is more than --max-pixels 4000" in err
    text_model = ["--load", str(root / "text_mcore"), "--tokenizer-model", str(root / "tokenizer")]
    err = _cli_error(capsys, "--backend", "cpu", *text_model, "--image", str(root / "a.png"), "--prompt", "Hi")
    assert "--image: --load holds a --model llama3 model" in err and "text only" in err
