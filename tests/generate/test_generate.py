"""``mtmegatron generate`` on megatron-core's static inference engine (KV cache), against references nobody
here wrote or that share no code with it.

One module fixture saves the tiny random HF Llama of tests/helpers/hf_models.py (GQA, untied head; 2 layers, 64
positions) and runs HF transformers' greedy ``generate`` on the prompts (hf_reference.py, one subprocess), converts
it with ``mtmegatron convert hf-to-mcore`` and saves a character-level tokenizer with a chat template
(tests/helpers/char_tokenizer.py). Then:
- the CLI with ``--chat``: the chat-rendered prompt tokens equal transformers' ``apply_chat_template`` and the
  generated tokens equal HF ``generate`` token for token;
- TP1 (one rank): the KV-cache engine equals the full-recompute greedy loop and HF; ``--top-k 1`` (with a
  temperature) equals greedy; top-k sampling is reproducible from ``--seed`` and changes with it;
- TP2 and PP2: the same greedy tokens as TP1, the KV-cache engine equals the recompute loop (TP2), every rank
  returns the same sampled tokens;
- DeepSeek-V3 (MLA, MoE, YaRN; its MTP layer not built): greedy equals the recompute loop and HF;
- a pretrain --save directory (Megatron-LM's checkpoint layout, model from its fingerprint) trained with
  ``--padded-vocab-size`` decodes, rebuilt with its rows;
- bad input: missing or empty checkpoint directory, a prompt longer than the model's positions, conflicting
  sampling flags: exit status 2 and one line, before any process group.
The two prompts have different lengths, so the static batch's mixed prefill/decode steps are exercised.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.char_tokenizer import save_char_tokenizer
from helpers.child_path import with_tests_on_path
from helpers.cli_subprocess import ENV, run_cli

HERE = Path(__file__).parent

PROMPTS = ["Hello, world", "Hi"]
NEW_TOKENS = 24
POSITIONS = 64  # the tiny HF Llama's max_position_embeddings


def _converted_with_reference(root: Path, family: str):
    """(converted checkpoint dir, tokenizer dir, HF reference {"plain"|"chat": {prompt_tokens, tokens}})."""
    hf_dir, mc_dir, tok_dir = root / "hf", root / "mcore", root / "tokenizer"
    save_char_tokenizer(str(tok_dir))
    (root / "prompts.json").write_text(json.dumps(PROMPTS))
    proc = subprocess.run([sys.executable, str(HERE / "hf_reference.py"), family, str(hf_dir), str(tok_dir),
                           str(root / "hf.json"), str(NEW_TOKENS), str(root / "prompts.json")],
                          capture_output=True, text=True, env=with_tests_on_path(ENV), timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    run_cli("convert", "hf-to-mcore", "--model", family, "--hf-dir", str(hf_dir), "--out", str(mc_dir))
    reference = json.loads((root / "hf.json").read_text())
    assert all(len(t) >= 8 for t in reference["plain"]["tokens"]), reference  # long enough to mean something
    return mc_dir, tok_dir, reference


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The tiny Llama converted, the tokenizer and HF's greedy tokens."""
    return _converted_with_reference(tmp_path_factory.mktemp("llama3"), "llama3")


def test_cli_chat_greedy_equals_hf_generate(tiny, tmp_path):
    mc_dir, tok_dir, reference = tiny
    out = tmp_path / "out.jsonl"
    argv = ["generate", "--backend", "cpu", "--load", str(mc_dir), "--tokenizer-model", str(tok_dir), "--chat",
            "--max-new-tokens", str(NEW_TOKENS), "--output", str(out)]
    proc = run_cli(*argv, *[a for p in PROMPTS for a in ("--prompt", p)])
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["prompt"] for r in rows] == PROMPTS
    assert [r["prompt_tokens"] for r in rows] == reference["chat"]["prompt_tokens"]  # HF's apply_chat_template
    assert [r["tokens"] for r in rows] == reference["chat"]["tokens"]
    assert "tokens/s" in proc.stdout and "greedy" in proc.stdout and "KV cache" in proc.stdout


def _generate_worker(rank, world_size, backend_name, load, tokenizer_dir, layout, greedy_only=False):
    """One rank: the model loaded as ``mtmegatron generate`` loads it, then several generations from it
    (``greedy_only``: the KV-cache engine and the recompute loop, greedy)."""
    import argparse

    import mtmegatron
    from mtmegatron.backends import get_backend
    from mtmegatron.generate.command import prepare
    from mtmegatron.inference.engine import Sampling, generate
    from mtmegatron.config.generate_flags import add_generate_args
    from mtmegatron.generate.model import build_and_load
    from mtmegatron.inference.recompute import generate_without_cache
    from mtmegatron.training.setup import init_distributed

    argv = ["--backend", backend_name, "--load", load, "--tokenizer-model", tokenizer_dir,
            "--max-new-tokens", str(NEW_TOKENS), *layout, *[a for p in PROMPTS for a in ("--prompt", p)]]
    args = add_generate_args(argparse.ArgumentParser()).parse_args(argv)
    _, prompts, prompt_tokens, tokenizer, margs, common = prepare(args)
    mtmegatron.activate(get_backend(backend_name))
    init_distributed(margs, get_backend(backend_name))
    model = build_and_load(margs, common["directory"])

    def tokens(**sampling):
        results, _ = generate(model, tokenizer, prompts, prompt_tokens, Sampling(NEW_TOKENS, **sampling))
        return [r.tokens for r in results]

    out = {"prompt_tokens": prompt_tokens, "greedy": tokens()}
    if not greedy_only:
        out.update(top_k_1=tokens(top_k=1, temperature=0.5), sampled=tokens(top_k=4, temperature=1.0, seed=7),
                   sampled_again=tokens(top_k=4, temperature=1.0, seed=7),
                   sampled_other_seed=tokens(top_k=4, temperature=1.0, seed=8))
    if margs.pipeline_model_parallel_size == 1:
        out["recompute"] = [r.tokens for r in generate_without_cache(model, tokenizer, prompts, prompt_tokens,
                                                                     NEW_TOKENS)[0]]
    return json.dumps(out)


_TP1: dict = {}


@pytest.fixture
def tp1(tiny, run_ranks):
    """The one-rank results, computed once for the module (run_ranks is function-scoped, hence the cache)."""
    if "result" not in _TP1:
        mc_dir, tok_dir, _ = tiny
        (result,) = run_ranks(_generate_worker, 1, "cpu", str(mc_dir), str(tok_dir), [], timeout=300)
        _TP1["result"] = json.loads(result)
    return _TP1["result"]


def test_kv_cache_engine_equals_recompute_and_hf(tiny, tp1):
    reference = tiny[2]["plain"]
    assert tp1["prompt_tokens"] == reference["prompt_tokens"]
    assert tp1["greedy"] == tp1["recompute"], "KV-cache engine vs full recompute"
    assert tp1["greedy"] == reference["tokens"], "KV-cache engine vs HF generate"


def test_top_k_1_is_greedy_and_sampling_follows_the_seed(tp1):
    assert tp1["top_k_1"] == tp1["greedy"]
    assert tp1["sampled"] == tp1["sampled_again"]
    assert tp1["sampled"] != tp1["greedy"]
    assert tp1["sampled"] != tp1["sampled_other_seed"]


@pytest.mark.parametrize("layout", [["--tensor-model-parallel-size", "2"], ["--pipeline-model-parallel-size", "2"]],
                         ids=["tp2", "pp2"])
def test_tp2_pp2_generate_what_tp1_does(tiny, tp1, run_ranks, layout):
    mc_dir, tok_dir, _ = tiny
    ranks = [json.loads(r) for r in run_ranks(_generate_worker, 2, "cpu", str(mc_dir), str(tok_dir), layout,
                                              timeout=300)]
    for result in ranks:
        assert result["greedy"] == tp1["greedy"]
        if "recompute" in result:  # TP2 (the recompute loop runs without pipeline parallelism)
            assert result["recompute"] == tp1["greedy"]
    assert ranks[0]["sampled"] == ranks[1]["sampled"], "ranks drew different samples"


def test_deepseek_v3_greedy_equals_hf_generate(tmp_path, run_ranks):
    """MLA (q LoRA, YaRN RoPE) with the static KV cache, first-k dense + MoE with the biased group-limited router;
    the checkpoint's MTP layer is not built for generation."""
    mc_dir, tok_dir, reference = _converted_with_reference(tmp_path, "deepseek-v3")
    (result,) = run_ranks(_generate_worker, 1, "cpu", str(mc_dir), str(tok_dir), [], True, timeout=300)
    result = json.loads(result)
    assert result["greedy"] == result["recompute"]
    assert result["greedy"] == reference["plain"]["tokens"]


def _cli_error(capsys, *argv) -> str:
    import torch

    from mtmegatron.cli import main

    assert main(list(argv)) == 2
    assert not torch.distributed.is_initialized()
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


def test_bad_input_is_one_line(tiny, tmp_path, capsys):
    mc_dir, tok_dir, _ = tiny
    base = ["generate", "--backend", "cpu", "--tokenizer-model", str(tok_dir)]
    err = _cli_error(capsys, *base, "--load", str(tmp_path / "missing"), "--prompt", "Hi")
    assert "--load" in err and "no such directory" in err
    os.makedirs(tmp_path / "empty")
    err = _cli_error(capsys, *base, "--load", str(tmp_path / "empty"), "--prompt", "Hi")
    assert "no complete checkpoint" in err
    err = _cli_error(capsys, *base, "--load", str(mc_dir), "--prompt", "x" * POSITIONS, "--max-new-tokens", "4")
    assert f"has {POSITIONS} tokens" in err and f"{POSITIONS} positions" in err
    err = _cli_error(capsys, *base, "--load", str(mc_dir), "--prompt", "Hi", "--top-k", "4", "--top-p", "0.9")
    assert "--top-k and --top-p" in err


@pytest.mark.parametrize("model_flags", [
    ["--model", "llama3", "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
     "--group-query-attention", "--num-query-groups", "2", "--ffn-hidden-size", "96", "--vocab-size", "300",
     "--no-untie-embeddings-and-output-weights", "--qk-layernorm", "--normalization", "LayerNorm",
     "--rotary-base", "10000"],
    ["--model", "mixtral", "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
     "--num-experts", "4", "--moe-router-topk", "2", "--vocab-size", "256"],
    ["--model", "llama3", "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
     "--vocab-size", "300", "--padded-vocab-size", "320"],  # rows other than the default padding's 384
    ["--model", "llama3", "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
     "--vocab-size", "300", "--make-vocab-size-divisible-by", "64"],
], ids=["llama3-off-preset", "mixtral", "padded-vocab-size", "vocab-divisible-by-64"])
def test_pretrain_checkpoint_flags_rebuild_the_same_model(model_flags):
    """A pretrain checkpoint records only the model fingerprint: the flags generate rebuilds from it describe the
    same model (every fingerprint field equal)."""
    from mtmegatron.convert.recorded_flags import flags_from_fingerprint
    from mtmegatron.models.fingerprint import fingerprint
    from mtmegatron.config.arguments import parse_args

    def parsed(flags):
        return parse_args(flags + ["--mock-data", "--backend", "cpu"], world_size=1, for_training=False)

    saved = fingerprint(parsed(model_flags))
    assert fingerprint(parsed(flags_from_fingerprint(saved))) == saved


def test_pretrain_checkpoint_generates_with_its_rows(tmp_path):
    """``generate --load`` on a pretrain --save directory (Megatron-LM's checkpoint layout, no model flags
    recorded) rebuilds the model from its fingerprint, with the rows --padded-vocab-size gave it (320, not the
    default padding's 256), and decodes."""
    from helpers.pretrain_runner import TINY, run_pretrain

    save = tmp_path / "ckpt"
    run_pretrain(1, TINY + ["--train-iters", "1", "--padded-vocab-size", "320", "--num-samples", "0", "--save",
                            str(save)], tmp_path / "run")
    tok_dir = tmp_path / "tok"
    save_char_tokenizer(str(tok_dir))  # 101 ids, within the model's 256
    out = tmp_path / "out.jsonl"
    run_cli("generate", "--backend", "cpu", "--load", str(save), "--tokenizer-model", str(tok_dir),
            "--max-new-tokens", "4", "--prompt", "hello", "--output", str(out))
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 1 and len(rows[0]["tokens"]) == 4
