"""Flags of ``mtmegatron generate`` and their validation (one ``GenerateError`` line per mistake).

Sampling: no sampling flag (or ``--temperature 0``, or ``--top-k 1``) is greedy; ``--top-k K`` or ``--top-p P``
(not both: megatron-core's sampler takes one) draws from the filtered distribution after ``--temperature``;
``--temperature T`` alone samples from the whole distribution. Model flags come from the checkpoint
(model.py); flags after ``--`` replace them for a checkpoint that does not record them.
May assume: nothing heavier than argparse is imported here.
"""

from __future__ import annotations

import argparse


class GenerateError(ValueError):
    """A user mistake in a generate request; the message is one line naming the flag and why."""


def add_generate_args(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("--load", required=True, help="checkpoint directory (torch_dist: `mtmegatron convert "
                   "hf-to-mcore` output or a pretrain --save directory); its latest checkpoint is used")
    p.add_argument("--lora-load", default=None, metavar="DIR",
                   help="LoRA adapters (a LoRA run's --save, or hf-to-mcore --peft-in) over the base in --load: "
                        "generate with them (their rank, alpha and targets from their record)")
    p.add_argument("--tokenizer-model", required=True,
                   help="local HF tokenizer (directory with tokenizer.json, and tokenizer_config.json for --chat)")
    p.add_argument("--prompt", action="append", default=None, help="a prompt (repeatable)")
    p.add_argument("--prompts-file", default=None, help="a text file with one prompt per line (blank lines skipped)")
    p.add_argument("--chat", action="store_true",
                   help="wrap each prompt as a user turn with the tokenizer's chat_template (HF transformers)")
    p.add_argument("--image", action="append", default=None, metavar="FILE",
                   help="an image every prompt asks about (repeatable; a vision-language model with a packed vision "
                        "encoder): rendered with the Qwen2-VL chat template as in training, an <image> tag in a "
                        "prompt places the next image, else the images come before the text "
                        "(tasks/qwen_vl/generate_images.py)")
    p.add_argument("--min-pixels", type=int, default=None,
                   help="with --image: smallest area an image is resized to (HF's image processor; default 3136)")
    p.add_argument("--max-pixels", type=int, default=None,
                   help="with --image: largest area an image is resized to (HF's image processor; default 1003520)")
    p.add_argument("--max-new-tokens", type=int, default=64, help="tokens to generate per prompt (default 64)")
    p.add_argument("--temperature", type=float, default=None, help="sampling temperature (0: greedy)")
    p.add_argument("--top-k", type=int, default=None, help="sample from the K most likely tokens (1: greedy)")
    p.add_argument("--top-p", type=float, default=None, help="nucleus sampling: the smallest set with mass >= P")
    p.add_argument("--seed", type=int, default=1234, help="seed of the sampling generator (same on every rank)")
    p.add_argument("--no-kv-cache", action="store_true",
                   help="greedy, re-running the whole sequence for every token (reference path; PP 1 only)")
    p.add_argument("--inference-max-requests", dest="inference_max_batch_size", type=int, default=8,
                   help="prompts decoded together in one static batch (Megatron-LM's flag; default 8)")
    p.add_argument("--tensor-model-parallel-size", type=int, default=1)
    p.add_argument("--pipeline-model-parallel-size", type=int, default=1)
    p.add_argument("--expert-model-parallel-size", type=int, default=1)
    p.add_argument("--bf16", action="store_true", help="run the model in bf16 (weights cast after loading)")
    p.add_argument("--backend", default=None, help="cpu, cuda or musa (default: auto-detect)")
    p.add_argument("--output", default=None, help="also write one JSON object per prompt to this .jsonl file")
    p.add_argument("model_flags", nargs=argparse.REMAINDER,
                   help="model flags after '--' for a checkpoint that does not record them "
                        "(e.g. -- --model llama3 --num-layers 4 ...)")
    return p


def sampling_from(args) -> dict:
    """``{temperature, top_k, top_p}`` for megatron-core's SamplingParams (validated)."""
    if args.max_new_tokens < 1:
        raise GenerateError("--max-new-tokens must be >= 1")
    if args.top_k is not None and args.top_k < 0:
        raise GenerateError("--top-k must be >= 0")
    if args.top_p is not None and not 0.0 <= args.top_p <= 1.0:
        raise GenerateError("--top-p must be between 0 and 1")
    if args.temperature is not None and args.temperature < 0:
        raise GenerateError("--temperature must be >= 0")
    if (args.top_k or 0) > 1 and (args.top_p or 0.0) > 0.0:
        raise GenerateError("--top-k and --top-p cannot both be used (megatron-core's sampler takes one)")
    if args.temperature == 0 or args.top_k == 1 or (args.temperature is None and args.top_k is None
                                                     and args.top_p is None):
        return {"temperature": 1.0, "top_k": 1, "top_p": 0.0}
    sampling = {"temperature": 1.0 if args.temperature is None else args.temperature,
                "top_k": args.top_k or 0, "top_p": args.top_p or 0.0}
    if args.no_kv_cache:
        raise GenerateError("--no-kv-cache is greedy only (drop --temperature/--top-k/--top-p)")
    return sampling


def read_prompts(args) -> list[str]:
    prompts = list(args.prompt or [])
    if args.prompts_file:
        try:
            with open(args.prompts_file, encoding="utf-8") as f:
                prompts += [line.rstrip("\n") for line in f if line.strip()]
        except OSError as e:
            raise GenerateError(f"--prompts-file {args.prompts_file}: {e.strerror}") from None
        except UnicodeDecodeError as e:
            raise GenerateError(f"--prompts-file {args.prompts_file}: not UTF-8 text (byte {e.start})") from None
    if not prompts:
        raise GenerateError("no prompt: give --prompt TEXT (repeatable) or --prompts-file FILE")
    if any(not p for p in prompts):
        raise GenerateError("--prompt: an empty prompt has nothing to continue")
    return prompts
