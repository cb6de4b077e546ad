"""``mtmegatron generate`` / ``torchrun --nproc_per_node N -m mtmegatron.generate``: load a checkpoint and a
tokenizer, generate for each prompt on megatron-core's static inference engine (engine.py, KV cache), print the
continuations and the throughput (generated tokens per second, all prompts together).

Every check that can fail on user input (flags, prompts, tokenizer, checkpoint presence and model flags,
prompt + new tokens within the model's positions) runs before any process group starts, identically on every
rank: a mistake is one line on rank 0 and exit status 2.
May assume: launched by torchrun or as one plain process (then a one-rank group is created).
"""

from __future__ import annotations

import json
import os
import sys

from mtmegatron.config.generate_flags import GenerateError, read_prompts, sampling_from
from mtmegatron.utils.quiet import quiet_checkpoint_noise


def _rank() -> int:
    return int(os.environ.get("RANK", "0"))


def _layout(args) -> list[str]:
    return ["--tensor-model-parallel-size", str(args.tensor_model_parallel_size),
            "--pipeline-model-parallel-size", str(args.pipeline_model_parallel_size),
            "--expert-model-parallel-size", str(args.expert_model_parallel_size)] + (["--bf16"] if args.bf16 else [])


def prepare(args):
    """Everything that can fail on user input: (sampling dict, prompts, token ids, tokenizer, model args, common)."""
    from mtmegatron.data.tokenizer import TokenizerError
    from mtmegatron.generate.model import model_args
    from mtmegatron.generate.tokenizer import GenerationTokenizer

    sampling = sampling_from(args)
    prompts = read_prompts(args)
    if args.no_kv_cache and args.pipeline_model_parallel_size > 1:
        raise GenerateError("--no-kv-cache runs without pipeline parallelism (use the KV-cache engine for PP)")
    if args.inference_max_batch_size < 1:
        raise GenerateError("--inference-max-requests must be >= 1")
    try:
        tokenizer = GenerationTokenizer(args.tokenizer_model)
        prompt_tokens = [tokenizer.encode_prompt(p, args.chat) for p in prompts]
    except TokenizerError as e:
        raise GenerateError(str(e)) from None
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    flags = [f for f in args.model_flags if f != "--"]
    model_args_, common = model_args(args.load, flags, _layout(args), args.backend, world_size)
    if args.lora_load:
        from mtmegatron.generate.model import lora_args

        common["lora_directory"] = lora_args(model_args_, args.lora_load)
    if tokenizer.vocab_size > model_args_.vocab_size:
        raise GenerateError(f"--tokenizer-model {args.tokenizer_model} has {tokenizer.vocab_size} tokens, the model "
                            f"only {model_args_.vocab_size}: not the tokenizer this model was trained with")
    check_lengths(args, prompt_tokens, model_args_)
    return sampling, prompts, prompt_tokens, tokenizer, model_args_, common


def check_lengths(args, prompt_tokens: list[list[int]], model_args_) -> None:
    """Every prompt has tokens, and with --max-new-tokens fits the model's positions (images' tokens included)."""
    limit = model_args_.max_position_embeddings
    for i, ids in enumerate(prompt_tokens):
        if not ids:
            raise GenerateError(f"prompt {i + 1} encodes to no tokens")
        if len(ids) + args.max_new_tokens > limit:
            raise GenerateError(f"prompt {i + 1} has {len(ids)} tokens; with --max-new-tokens {args.max_new_tokens} "
                                f"that exceeds the model's {limit} positions (--max-position-embeddings)")


def run(args) -> int:
    from mtmegatron.backends import select_backend

    quiet_checkpoint_noise()
    sampling, prompts, prompt_tokens, tokenizer, margs, common = prepare(args)
    from mtmegatron.tasks.qwen_vl.generate_images import vision_prompts

    prompt_tokens, visions = vision_prompts(args, prompts, prompt_tokens, tokenizer, margs, GenerateError)  # None: text
    check_lengths(args, prompt_tokens, margs)
    backend = select_backend(margs.backend)
    import torch

    import mtmegatron
    from mtmegatron.inference.engine import Sampling, generate
    from mtmegatron.generate.model import build_and_load
    from mtmegatron.training.setup import init_distributed

    mtmegatron.activate(backend)
    init_distributed(margs, backend)
    try:
        model = build_and_load(margs, common["directory"], common.get("lora_directory"))
        if visions is not None:  # a vision-language model: M-RoPE positions, the prompts' images merged
            from mtmegatron.tasks.qwen_vl.generate_images import generate_for_vision_model

            results, seconds = generate_for_vision_model(args, model, tokenizer, prompts, prompt_tokens, visions,
                                                         Sampling(args.max_new_tokens, seed=args.seed, **sampling))
        elif args.no_kv_cache:
            from mtmegatron.inference.recompute import generate_without_cache

            results, seconds = generate_without_cache(model, tokenizer, prompts, prompt_tokens, args.max_new_tokens)
        else:
            results, seconds = generate(model, tokenizer, prompts, prompt_tokens,
                                        Sampling(args.max_new_tokens, seed=args.seed, **sampling),
                                        max_batch_size=args.inference_max_batch_size)
        if _rank() == 0:
            report(args, results, seconds, backend, margs, sampling)
        torch.distributed.barrier()
    finally:
        torch.distributed.destroy_process_group()
    return 0


def describe_sampling(sampling: dict) -> str:
    if sampling["top_k"] == 1:
        return "greedy"
    how = f"top-k {sampling['top_k']}" if sampling["top_k"] else f"top-p {sampling['top_p']}" if sampling["top_p"] \
        else "full distribution"
    return f"sampled ({how}, temperature {sampling['temperature']})"


def report(args, results, seconds: float, backend, margs, sampling: dict) -> None:
    for i, result in enumerate(results):
        print(f"--- prompt {i + 1}: {result.prompt!r}\n{result.text}", flush=True)
    generated = sum(len(r.tokens) for r in results)
    engine = "no KV cache (full recompute)" if args.no_kv_cache else "megatron-core static engine, KV cache"
    print(f"mtmegatron generate: {generated} tokens for {len(results)} prompts in {seconds:.2f} s = "
          f"{generated / max(seconds, 1e-9):.1f} tokens/s | {describe_sampling(sampling)} | {engine} | backend "
          f"{backend.name}, TP {margs.tensor_model_parallel_size} x PP {margs.pipeline_model_parallel_size}"
          f"{f', EP {margs.expert_model_parallel_size}' if margs.expert_model_parallel_size > 1 else ''}",
          flush=True)
    if args.output:
        with open(args.output, "w", encoding="utf-8") as f:
            for r in results:
                f.write(json.dumps({"prompt": r.prompt, "prompt_tokens": r.prompt_tokens, "tokens": r.tokens,
                                    "text": r.text}) + "\n")


def main_with_errors(args) -> int:
    """``run`` with user mistakes as one line (rank 0) and exit status 2."""
    from mtmegatron.backends import BackendUnavailableError
    from mtmegatron.utils.errors import describe_os_error

    try:
        return run(args)
    except (GenerateError, BackendUnavailableError, OSError) as e:  # OSError: e.g. --output on a full disk
        if _rank() == 0:
            message = describe_os_error(e) if isinstance(e, OSError) else e
            print(f"mtmegatron generate: error: {message}", file=sys.stderr, flush=True)
        return 2
