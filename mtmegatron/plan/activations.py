"""Activation bytes a rank keeps for backward: per layer and micro-batch, and how many micro-batches are in flight.

Per transformer layer and micro-batch, the tensors megatron-core's layers save for backward, counted from the
layer's shapes (s = sequence / CP, b = micro-batch, h = hidden, kv = query groups x head dim, hq = heads x head
dim, f = FFN hidden, D = bytes of the activation dtype, t = TP) and from which implementations the layers run
(plan/params.layer_kinds on the meta model; the run's backend for our SDPA's kernel and the jit fusions):
- norms: each norm's input and output (the next linear's input), 4 h per layer; torch's ``RMSNorm`` (megatron-core's
  fallback without apex/TE) also keeps its fp32 input and normalised product (8 bytes an element under 16-bit);
- attention: Q/K/V after RoPE (hq + 2 kv) and the output (hq), and by core attention:
  megatron-core's local ``DotProductAttention`` repeats K/V to every query head (3 hq kept) and keeps the softmax
  output (heads x s x s, D bytes; with attention dropout the mask and dropped copy too); our SDPA on a flash
  kernel keeps the inputs, output and log-sum-exp; on torch's math kernel (the backend names no kernel, or names
  MUSA's and this process's torch_musa has none) it keeps fp32 Q and repeated K/V and fp32 probabilities;
  selective recompute of ``core_attn`` keeps its inputs only;
- MLP: fc1's output (2f gated / f) and the activation's output (f); megatron-core's unfused gated activation
  (``glu``: silu(x) * (x_lin + offset)) also keeps the silu output and the offset sum (5 f in all); an MoE layer's
  experts see top-k copies of the tokens (permuted input h, unpermute input h and the MLP's terms per copy) plus the
  router's fp32 logits: approximate (balanced routing assumed);
- dropout masks (1 byte an element) where the hidden dropout probability is > 0;
- LoRA adapters (plan/params._lora_elements): A's output (r per part) per target, a column adapter's gathered input
  under SP, the dropped input copy with --lora-dropout; an expert's adapters once per routed token copy (top-k).
With sequence parallelism everything is divided by t; without it the norms' terms are whole on every TP rank.
``--recompute-granularity full`` keeps only each recomputed layer's input (h, / t with SP) plus one layer's
activations recomputed at a time. One layer's backward adds the gradients of its s^2 probabilities and scores
where they are kept (2 D bytes an element; fp32 on the math kernel). Megatron-LM's formula (Korthikanti et al.,
Table 2: 34 s b h + 5 a s^2 b per layer in 16-bit, ``sbh(18 + 4 f/h)/t`` with SP and selective recompute) counts
the GPT-3 layer with fused kernels (4h FFN, no GQA, with dropout). benchmarks/plan_validation.py checks these
counts against the simulated MUSA device (docs/memory.md).
In flight (the schedule's warm-up depth): no pipeline 1; 1F1B ``min(pp - stage, micro-batches)``; interleaved
``min((pp - stage - 1) x 2 + (vpp - 1) x pp + 1, micro-batches x vpp)`` chunk passes (megatron-core's
schedules.py warm-up counts), each holding one chunk's layers.
May assume: a validated pretrain configuration (config.parse) and the chunks of plan/params.py.
"""

from __future__ import annotations

import functools


def _dims(args):
    s = args.seq_length // args.context_parallel_size
    head_dim = args.kv_channels or args.hidden_size // args.num_attention_heads
    groups = args.num_query_groups if args.group_query_attention else args.num_attention_heads
    return s, args.micro_batch_size, args.hidden_size, groups * head_dim, head_dim


def activation_dtype_bytes(args) -> int:
    return 2 if (args.bf16 or args.fp16) else 4


def _selective_modules(args) -> set[str]:
    if args.recompute_granularity != "selective":
        return set()
    return set(args.recompute_modules if args.recompute_modules is not None else ["core_attn"])


@functools.lru_cache(maxsize=None)
def _backend_answers(name: str | None, dtype_name: str, head_dim: int) -> tuple[str, bool]:
    """(our SDPA's kernel, whether megatron-core's jit fusions run) on backend ``name`` (cpu when unknown or auto):
    attention/blocks.py's kernel choice (``math`` where the backend names none, or names MUSA's flash kernel and
    this process's torch_musa has no such op) and models/fusions.py's rule. Cached: --search asks per layout."""
    import torch

    from mtmegatron.attention.blocks import block_kernel
    from mtmegatron.backends.registry import known_backends

    backends = known_backends()
    backend = backends.get(name or "cpu", backends["cpu"])
    kernel = block_kernel(backend.device_type, getattr(torch, dtype_name), head_dim, head_dim)
    return kernel, "jit" not in backend.fusions_missing()


def _answers(args) -> tuple[str, bool]:
    dtype = "bfloat16" if args.bf16 else "float16" if args.fp16 else "float32"
    return _backend_answers(args.backend, dtype,
                            args.kv_channels or args.hidden_size // args.num_attention_heads)


def sdpa_kernel(args) -> str:
    """The kernel our SDPA core attention runs on the run's backend."""
    return _answers(args)[0]


def activation_fused(args) -> bool:
    """megatron-core's bias-activation fusion runs (models/fusions.py: on by flag where the run's backend compiles
    megatron-core's jit fusions)."""
    asked = args.bias_swiglu_fusion if args.swiglu else args.bias_gelu_fusion
    return bool(asked) and _answers(args)[1]


def _activation_elements(args, f: int) -> float:
    """Elements per token the MLP keeps from fc1's output on: fc1's output and the activation's output (fc2's
    input); megatron-core's unfused gated activation (``glu``: silu(x_glu) * (x_linear + offset)) keeps the silu
    output and the offset sum too."""
    if not args.swiglu:
        return 2 * f
    return 3 * f if activation_fused(args) else 5 * f


def _core_attention(args, kind: str, recomputed: bool) -> tuple[float, float]:
    """(bytes per token, of which the s-proportional part) the core attention keeps per layer on one TP rank,
    its inputs (Q/K/V after RoPE) and output included. ``local``: megatron-core's DotProductAttention repeats K/V to
    every query head (GQA), keeps the softmax output (D bytes per s^2 element; with attention dropout also the mask
    and the dropped probabilities); ``sdpa`` on the math kernel: upcasts Q and the repeated K/V to fp32 under
    16-bit and keeps fp32 probabilities; on a flash kernel only the inputs and output (and the log-sum-exp)."""
    s, _, h, kv, head_dim = _dims(args)
    t, D = args.tensor_model_parallel_size, activation_dtype_bytes(args)
    heads = args.num_attention_heads
    hq = heads * head_dim
    inputs = (hq + 2 * kv) * D
    if recomputed or kind == "other":
        return (inputs + hq * D) / t, 0.0
    if kind == "local":
        dropout = (D + 1) if args.attention_dropout > 0 else 0
        scores = heads * s * (D + dropout)
        return (3 * hq * D + hq * D + scores) / t, scores / t
    if sdpa_kernel(args) == "math":
        scores = heads * s * 4
        qkv = 3 * hq * 4 if D < 4 else inputs + 2 * (hq - kv) * D
        return (qkv + hq * D + scores) / t, scores / t
    return (inputs + hq * D + heads * 4) / t, 0.0


def layer_bytes(args, moe: bool, chunk=None) -> float:
    """Bytes one transformer layer keeps for backward per micro-batch on one rank (no full recompute). ``chunk``
    (plan/params.Chunk) says which norm and core attention the layers run (default: fused norms, our SDPA)."""
    s, b, h, kv, _ = _dims(args)
    t, D = args.tensor_model_parallel_size, activation_dtype_bytes(args)
    sp = bool(args.sequence_parallel) or t == 1
    recomputed = _selective_modules(args)
    norm_side = 4 * h * D  # norm inputs and linear inputs: whole on every TP rank without SP
    if getattr(chunk, "torch_rmsnorm", False):  # torch's RMSNorm keeps its fp32 input and normalised product
        norm_side += 2 * h * (8 if D < 4 else 4)
    attention, _ = _core_attention(args, getattr(chunk, "core_attention", "sdpa"), "core_attn" in recomputed)
    if moe:
        f = args.moe_ffn_hidden_size or args.ffn_hidden_size
        k = args.moe_router_topk
        act = _activation_elements(args, f)
        mlp = k * (2 * h + act)
        if "moe_act" in recomputed:
            mlp -= k * (act - (2 if args.swiglu else 1) * f)
        if args.moe_shared_expert_intermediate_size:
            mlp += _activation_elements(args, args.moe_shared_expert_intermediate_size)
    else:
        mlp = _activation_elements(args, args.ffn_hidden_size)
        if "mlp" in recomputed:
            mlp = 0
    per_token = norm_side / (t if sp else 1) + attention + mlp * D / t
    lora_d = 4 if args.lora_fp32_adapters else D  # LoRA adapters (plan/params._lora_elements)
    per_token += (getattr(chunk, "lora_dense", 0.0)
                  + (args.moe_router_topk * getattr(chunk, "lora_expert", 0.0) if moe else 0.0)) * lora_d
    total = s * b * per_token
    if moe:  # the router's fp32 logits and probabilities, every token of the (SP-split) sequence
        total += s * b * args.num_experts * 4 * 2 / (t if sp else 1)
    masks = 0.0
    if args.hidden_dropout > 0:
        masks += 2 * s * b * h / (t if sp else 1)
    return total + masks


def recomputed_layer_input_bytes(args) -> float:
    s, b, h, _, _ = _dims(args)
    t = args.tensor_model_parallel_size
    sp = bool(args.sequence_parallel) or t == 1
    return s * b * h * activation_dtype_bytes(args) / (t if sp else 1)


def chunk_bytes(args, chunk) -> float:
    """One micro-batch through one model chunk: its layers' saved tensors (after full recompute: inputs only)."""
    moe_share = chunk.moe_layers / chunk.layers if chunk.layers else 0.0
    per_layer = ((1 - moe_share) * layer_bytes(args, False, chunk)
                 + (moe_share * layer_bytes(args, True, chunk) if moe_share else 0))
    mtp = chunk.mtp_layers * layer_bytes(args, False, chunk)
    if args.recompute_granularity == "full":
        n = chunk.layers if args.recompute_method == "uniform" else min(args.recompute_num_layers or 0, chunk.layers)
        return (chunk.layers - n) * per_layer + n * recomputed_layer_input_bytes(args) + mtp
    return chunk.layers * per_layer + mtp


def recompute_transient(args, stage) -> float:
    """What one layer's backward adds while it runs: full recompute, the layer's activations live again; else the
    gradients of the attention's s^2 probabilities and scores where the core attention keeps them (2 D bytes an
    element, fp32 on SDPA's math kernel), and with selective recompute of ``core_attn`` what it recomputes."""
    moe = any(c.moe_layers for c in stage.chunks)  # the larger kind where both are present
    chunk = stage.chunks[0]
    if args.recompute_granularity == "full":
        return layer_bytes(args, moe, chunk)
    s, b, _, _, _ = _dims(args)
    kind = getattr(chunk, "core_attention", "sdpa")
    _, scores = _core_attention(args, kind, False)
    if not scores:
        return 0.0
    grads = 2 * (activation_dtype_bytes(args) if kind == "local" else 4) * args.num_attention_heads * s / args.tensor_model_parallel_size
    kept = _core_attention(args, kind, False)[0] if "core_attn" in _selective_modules(args) else 0.0
    return s * b * (grads + kept)


def in_flight(args, stage: int) -> int:
    """Micro-batches (chunk passes with virtual stages) whose activations one chunk holds at the peak."""
    pp, m = args.pipeline_model_parallel_size, args.num_microbatches
    vpp = args.virtual_pipeline_model_parallel_size
    if pp == 1:
        return 1
    if vpp:
        return min((pp - stage - 1) * 2 + (vpp - 1) * pp + 1, m * vpp)
    return min(pp - stage, m)


def stage_activation_bytes(args, stage) -> float:
    """The activations stage ``stage`` (plan/params.StageParams) holds at its peak."""
    per_pass = [chunk_bytes(args, c) for c in stage.chunks]
    passes = in_flight(args, stage.stage)
    if len(per_pass) == 1:
        return per_pass[0] * passes + recompute_transient(args, stage)
    # interleaved: the warm-up runs the chunks in order, one chunk per pass; the mean over chunks is exact for
    # equal chunks and close for the first/last stage's embedding and output, counted as buffers
    return sum(per_pass) / len(per_pass) * passes + recompute_transient(args, stage)
