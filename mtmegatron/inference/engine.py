"""Generation on megatron-core's own inference engine: ``StaticInferenceEngine`` (legacy static batching) over
``GPTInferenceWrapper`` and ``TextGenerationController``, with the KV cache of ``StaticInferenceContext``.

Why the static engine: megatron-core 0.16's ``DynamicInferenceEngine`` (and ``StaticInferenceEngine`` in its
default, non-legacy mode, which runs the dynamic one underneath) attends through ``flash_attn_varlen_func`` /
``flash_attn_with_kvcache`` (FlashAttention, CUDA only) on a paged KV cache whose append kernel is Triton, and
captures CUDA graphs: none of that runs on the CPU backend or on MUSA. The static context keeps a plain
``[max_seq, max_batch, heads, dim]`` KV cache per layer and runs each step through the model's own core
attention (our SDPA or megatron-core's local one), so it runs on every backend. Prefill covers the shortest
prompt of the batch; after that every step feeds one token per prompt (longer prompts are fed their own
tokens until they start generating).
Sampling is megatron-core's (``SamplingParams``): greedy is ``top_k=1`` (argmax); otherwise temperature, then
top-k or top-p, drawn with the controller's generator seeded from ``config.inference_sampling_seed`` (set
from ``--seed``), identically on every rank. TP: logits are gathered in the model; PP: megatron-core sends
activations stage to stage and broadcasts the last stage's logits, so every rank samples the same token.
Sequence parallelism is switched off for the duration (megatron-core's static path refuses it for dense
models) and restored afterwards. Not supported: context parallelism (the KV cache is not split over CP
ranks), interleaved (virtual) pipeline chunks. The engine's progress bar (tqdm on stderr) is shown by rank 0
only: every rank runs the same requests, so the other ranks' bars would repeat it.
May assume: parallel state initialised, one model chunk per rank, called on every rank with the same prompts.
"""

from __future__ import annotations

import contextlib
import io
import time
import warnings
from dataclasses import dataclass

import torch

GREEDY = {"temperature": 1.0, "top_k": 1, "top_p": 0.0}


@dataclass
class Sampling:
    """What to draw: greedy (``top_k`` 1) or temperature + top-k / top-p, as megatron-core's SamplingParams."""

    max_new_tokens: int
    temperature: float = 1.0
    top_k: int = 1
    top_p: float = 0.0
    seed: int = 1234

    @property
    def greedy(self) -> bool:
        return self.top_k == 1


@dataclass
class Generation:
    prompt: str
    prompt_tokens: list[int]
    tokens: list[int]
    text: str


def _unwrap(model):
    """The GPTModel inside DDP / Float16Module wrappers."""
    while hasattr(model, "module"):
        model = model.module
    return model


def _sampling_params(sampling: Sampling):
    from megatron.core.inference.sampling_params import SamplingParams

    return SamplingParams(temperature=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p,
                          num_tokens_to_generate=sampling.max_new_tokens)


def build_engine(model, tokenizer, max_batch_size: int, max_sequence_length: int, seed: int, wrapper_class=None,
                 controller_class=None):
    """megatron-core's static engine around ``model`` (a GPTModel, or the Float16Module around one); a model with
    other inputs brings its own wrapper/controller subclasses (tasks/qwen_vl/generate_engine.py)."""
    from megatron.core.inference.contexts import StaticInferenceContext
    from megatron.core.inference.engines import StaticInferenceEngine
    from megatron.core.inference.model_inference_wrappers.gpt.gpt_inference_wrapper import GPTInferenceWrapper
    from megatron.core.inference.model_inference_wrappers.inference_wrapper_config import InferenceWrapperConfig
    from megatron.core.inference.text_generation_controllers.text_generation_controller import (
        TextGenerationController)

    config = _unwrap(model).config
    config.inference_sampling_seed = seed  # read by the controller's generator when it is built
    wrapper_config = InferenceWrapperConfig(
        hidden_size=config.hidden_size, params_dtype=config.params_dtype,
        inference_batch_times_seqlen_threshold=-1,  # PP: one forward over the whole batch, no micro-batches
        padded_vocab_size=_unwrap(model).vocab_size, inference_max_requests=max_batch_size,
        inference_max_seq_length=max_sequence_length, fp32_residual_connection=config.fp32_residual_connection)
    context = StaticInferenceContext(max_batch_size, max_sequence_length)
    wrapped = (wrapper_class or GPTInferenceWrapper)(model, wrapper_config, context)
    controller = (controller_class or TextGenerationController)(inference_wrapped_model=wrapped, tokenizer=tokenizer)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "the static engine will be deprecated": it is the one that runs here
        return StaticInferenceEngine(controller, max_batch_size=max_batch_size, random_seed=seed, legacy=True)


def run_engine(engine, prompts: list[str], prompt_tokens: list[list[int]], sampling: Sampling,
               tokenizer, request_extras: list[dict] | None = None) -> tuple[list[Generation], float]:
    """Generate for every prompt (one static batch per ``max_batch_size`` prompts); returns the generations in
    prompt order and the seconds it took (synchronised with the other ranks). ``request_extras``: per prompt,
    attributes set on its request for a controller subclass to read (e.g. its images)."""
    from megatron.core.inference.inference_request import InferenceRequest

    params = _sampling_params(sampling)
    requests = [InferenceRequest(request_id=engine.get_new_request_id(), prompt=prompt, prompt_tokens=list(ids),
                                 sampling_params=params) for prompt, ids in zip(prompts, prompt_tokens)]
    for request, extra in zip(requests, request_extras or []):
        vars(request).update(extra)
    model = _unwrap(engine.controller.inference_wrapped_model.model)
    sequence_parallel = model.config.sequence_parallel
    if sequence_parallel:
        from megatron.core.transformer.utils import set_model_to_sequence_parallel

        set_model_to_sequence_parallel(model, False)
    torch.distributed.barrier()
    start = time.perf_counter()
    try:
        rank0 = torch.distributed.get_rank() == 0
        bar = contextlib.nullcontext() if rank0 else contextlib.redirect_stderr(io.StringIO())  # its progress bar
        with warnings.catch_warnings(), bar:
            warnings.simplefilter("ignore")
            done = engine.generate(inference_requests=requests)
    finally:
        if sequence_parallel:
            set_model_to_sequence_parallel(model, True)
    torch.distributed.barrier()
    seconds = time.perf_counter() - start
    out = []
    for request in done:
        tokens = [int(t) for t in request.generated_tokens.tolist()]
        out.append(Generation(request.prompt, list(request.prompt_tokens), tokens, tokenizer.detokenize(tokens)))
    return out, seconds


def generate(model, tokenizer, prompts: list[str], prompt_tokens: list[list[int]], sampling: Sampling,
             max_batch_size: int = 8, wrapper_class=None, controller_class=None,
             request_extras: list[dict] | None = None) -> tuple[list[Generation], float]:
    """Build the engine for this batch and run it (the KV cache is sized for the longest prompt + new tokens)."""
    longest = max(len(ids) for ids in prompt_tokens) + sampling.max_new_tokens
    was_training = model.training
    engine = build_engine(model, tokenizer, min(max_batch_size, len(prompts)), longest, sampling.seed, wrapper_class,
                          controller_class)
    try:
        return run_engine(engine, prompts, prompt_tokens, sampling, tokenizer, request_extras)
    finally:
        engine.controller.inference_wrapped_model.inference_context.key_value_memory_dict.clear()
        model.train(was_training)
