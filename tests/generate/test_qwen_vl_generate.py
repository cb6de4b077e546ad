"""``mtmegatron generate --image`` on the tiny Qwen2-VL and Qwen2.5-VL against HF transformers' own greedy
``generate`` (the reference nobody here wrote).

Per family, one subprocess (qwen_vl_reference.py) saves a random tiny HF model (perturbed: no identity norm, no
zero bias), a tokenizer with the preset's special-token ids, two images of different sizes (4x6 and 8x4 patches),
runs HF ``generate(do_sample=False)`` on two prompts each alone, and converts the model with ``hf_to_mcore``. Our
side loads the converted checkpoint as ``mtmegatron generate`` does and decodes both prompts as one static batch:
- prompt ids equal HF's rendering (chat template + the processor's pad expansion);
- KV cache (megatron-core's static engine, inference/vision_engine.py): HF's 16 greedy tokens for both prompts;
  the second prompt is the longer and its second image lies past the first prompt's end, so its embeddings are
  merged in decode steps, not the prefill; the cache-free loop (inference/vision_recompute.py) gives the same;
- the test can see what it checks: decoding with text positions after the prompt (no ``rope_delta``) or with
  blank images gives other tokens; sampling follows ``--seed``;
- TP2 (Qwen2.5-VL: windowed vision attention, both towers split): the same greedy tokens on both ranks;
- the CLI (Qwen2-VL): the same tokens in --output, the KV-cache engine named in the report line;
- bad input, one line and exit 2 before any process group: a missing image, a corrupt one, an image for a text
  model, ``<image>`` tags that do not match the images.
Cost (measured, 2 shared cores under load): ~XX s.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.child_path import with_tests_on_path
from helpers.cli_subprocess import ENV, run_cli

HERE = Path(__file__).parent
CASES = {"qwen2-vl": "Qwen2VLForConditionalGeneration", "qwen2.5-vl": "Qwen2_5_VLForConditionalGeneration"}
NEW_TOKENS = 16
_CONVERTED: dict = {}
_ONE_RANK: dict = {}


def _prompts():
    sys.path.insert(0, str(HERE))
    from qwen_vl_reference import PROMPTS

    return PROMPTS


def converted(name: str, tmp_path_factory):
    """(root with hf/, mcore/, tokenizer/, a.png, b.png; HF's reference), made once per family."""
    if name not in _CONVERTED:
        root = tmp_path_factory.mktemp(name.replace(".", "_"))
        text_model = ["--text-model"] if name == "qwen2-vl" else []  # for the refusal test
        proc = subprocess.run([sys.executable, str(HERE / "qwen_vl_reference.py"), name, CASES[name], str(root),
                               str(NEW_TOKENS), *text_model], capture_output=True, text=True,
                              env=with_tests_on_path(ENV), timeout=300)
        assert proc.returncode == 0, proc.stderr[-4000:]
        reference = json.loads((root / "reference.json").read_text())
        assert all(len(t) >= 8 for t in reference["tokens"]), reference  # long enough to mean something
        assert reference["grids"] == [[1, 4, 6], [1, 8, 4]]
        _CONVERTED[name] = root, reference
    return _CONVERTED[name]


def _argv(root: Path, prompts: list[str], *extra: str) -> list[str]:
    return ["--backend", "cpu", "--load", str(root / "mcore"), "--tokenizer-model", str(root / "tokenizer"),
            "--max-new-tokens", str(NEW_TOKENS), "--image", str(root / "a.png"), "--image", str(root / "b.png"),
            *[a for p in prompts for a in ("--prompt", p)], *extra]


def _generate_worker(rank, world_size, backend_name, root, prompts, layout, greedy_only=False):
    """One rank: the model loaded as ``mtmegatron generate`` loads it, then generations from it."""
    import argparse

    import torch

    import mtmegatron
    import mtmegatron.inference.vision_prompts as vision_prompts_module
    from mtmegatron.backends import get_backend
    from mtmegatron.generate.command import prepare
    from mtmegatron.generate.flags import add_arguments
    from mtmegatron.generate.images import vision_prompts
    from mtmegatron.generate.model import build_and_load
    from mtmegatron.inference.engine import Sampling
    from mtmegatron.inference.vision_engine import generate_with_images
    from mtmegatron.inference.vision_prompts import VisionPrompt
    from mtmegatron.inference.vision_recompute import generate_with_images_without_cache
    from mtmegatron.training.setup import init_distributed

    args = add_arguments(argparse.ArgumentParser()).parse_args(_argv(Path(root), prompts, *layout))
    _, prompts, prompt_tokens, tokenizer, margs, common = prepare(args)
    prompt_tokens, visions = vision_prompts(args, prompts, prompt_tokens, tokenizer, margs)
    mtmegatron.activate(get_backend(backend_name))
    init_distributed(margs, get_backend(backend_name))
    model = build_and_load(margs, common["directory"])

    def tokens(visions=visions, **sampling):
        results, _ = generate_with_images(model, tokenizer, prompts, prompt_tokens, visions,
                                          Sampling(NEW_TOKENS, **sampling))
        return [r.tokens for r in results]

    out = {"prompt_tokens": prompt_tokens, "greedy": tokens()}
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
def one_rank(tmp_path_factory, run_ranks):
    """name -> the one-rank results of that family (computed once per family)."""

    def results(name: str):
        if name not in _ONE_RANK:
            root, _ = converted(name, tmp_path_factory)
            (result,) = run_ranks(_generate_worker, 1, "cpu", str(root), _prompts(), [], timeout=300)
            _ONE_RANK[name] = json.loads(result)
        return _ONE_RANK[name]

    return results


@pytest.mark.parametrize("name", list(CASES))
def test_greedy_with_images_equals_hf_generate(name, tmp_path_factory, one_rank):
    _, reference = converted(name, tmp_path_factory)
    ours = one_rank(name)
    assert ours["prompt_tokens"] == reference["prompt_tokens"], "the chat template / pad expansion differ from HF's"
    assert ours["greedy"] == reference["tokens"], "KV-cache engine vs HF generate"
    assert ours["recompute"] == reference["tokens"], "full recompute vs HF generate"


@pytest.mark.parametrize("name", list(CASES))
def test_decode_positions_and_images_matter(name, tmp_path_factory, one_rank):
    """Without HF's rope_delta after the prompt, or with blank images, the tokens differ: the comparison above sees
    both; and sampling (the controller's) follows the seed."""
    _, reference = converted(name, tmp_path_factory)
    ours = one_rank(name)
    assert ours["no_rope_delta"] != reference["tokens"]
    assert ours["blank_images"] != reference["tokens"]
    assert ours["sampled"] == ours["sampled_again"] != ours["greedy"]


def test_tp2_generates_hf_tokens(tmp_path_factory, run_ranks):
    root, reference = converted("qwen2.5-vl", tmp_path_factory)
    ranks = [json.loads(r) for r in run_ranks(_generate_worker, 2, "cpu", str(root), _prompts(),
                                              ["--tensor-model-parallel-size", "2"], True, timeout=300)]
    assert [r["greedy"] for r in ranks] == [reference["tokens"]] * 2


def test_cli_writes_hf_tokens(tmp_path_factory, tmp_path):
    root, reference = converted("qwen2-vl", tmp_path_factory)
    out = tmp_path / "out.jsonl"
    proc = run_cli("generate", *_argv(root, _prompts(), "--output", str(out)))
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["tokens"] for r in rows] == reference["tokens"]
    assert [r["prompt_tokens"] for r in rows] == reference["prompt_tokens"]
    assert "greedy" in proc.stdout and "KV cache" in proc.stdout


def _cli_error(capsys, *argv) -> str:
    import torch

    from mtmegatron.cli import main

    assert main(["generate", *argv]) == 2
    assert not torch.distributed.is_initialized()
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


def test_bad_images_are_one_line(tmp_path_factory, tmp_path, capsys):
    root, _ = converted("qwen2-vl", tmp_path_factory)
    base = ["--backend", "cpu", "--load", str(root / "mcore"), "--tokenizer-model", str(root / "tokenizer")]
    missing = tmp_path / "missing.png"
    err = _cli_error(capsys, *base, "--image", str(missing), "--prompt", "Hi")
    assert f"--image {missing}: no such file" in err
    corrupt = tmp_path / "corrupt.png"
    corrupt.write_bytes((root / "a.png").read_bytes()[:60])  # a truncated PNG
    err = _cli_error(capsys, *base, "--image", str(corrupt), "--prompt", "Hi")
    assert f"--image {corrupt}: cannot read it as an image" in err
    err = _cli_error(capsys, *base, "--image", str(root / "a.png"), "--prompt", "<image> and <image>")
    assert "prompt 1 has 2 <image> tag(s) but 1 --image file(s)" in err
    text_model = ["--load", str(root / "text_mcore"), "--tokenizer-model", str(root / "tokenizer")]
    err = _cli_error(capsys, "--backend", "cpu", *text_model, "--image", str(root / "a.png"), "--prompt", "Hi")
    assert "--image: --load holds a --model llama3 model" in err and "text only" in err
