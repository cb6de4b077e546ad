"""Activation bytes a rank keeps for backward: per layer and micro-batch, and how many micro-batches are in flight.

Per transformer layer and micro-batch, the tensors megatron-core's local and TE layers save for backward, counted
from the layer's shapes (s = sequence / CP, b = micro-batch, h = hidden, kv = query groups x head dim,
f = FFN hidden, D = bytes of the activation dtype, t = TP):
- attention block: the norm's input (h), the QKV linear's input (h), Q/K/V after RoPE (h + 2 kv), the core
  attention's output = the projection's input (h); without selective recompute of ``core_attn`` the unfused
  (``--attention-backend local``) attention's scores and softmax output (D bytes each) and dropout mask (1 byte),
  heads x s x s per sequence (Korthikanti's 5 a s^2 b at D = 2); flash/SDPA keep only the output;
- MLP block: the norm's input (h), fc1's input (h), fc1's output (2f gated / f), the activation's output (f);
  an MoE layer's experts see top-k copies of the tokens (permuted input h, fc1 out, act out, unpermute input h per
  copy) plus the router's fp32 logits: approximate (balanced routing assumed);
- dropout masks (1 byte an element) where the dropout probability is > 0.
With sequence parallelism everything is divided by t; without it the norms' inputs and outputs (4 h) are whole on
every TP rank. ``--recompute-granularity full`` keeps only each recomputed layer's input (h, / t with SP) plus one
layer's activations recomputed at a time. Megatron-LM's formula (Korthikanti et al., Table 2: 34 s b h + 5 a s^2 b
per layer in 16-bit, ``sbh(18 + 4 f/h)/t`` with SP and selective recompute) is the same accounting for the GPT-3
layer (4h FFN, no GQA, with dropout).
In flight (the schedule's warm-up depth): no pipeline 1; 1F1B ``min(pp - stage, micro-batches)``; interleaved
``min((pp - stage - 1) x 2 + (vpp - 1) x pp + 1, micro-batches x vpp)`` chunk passes (megatron-core's
schedules.py warm-up counts), each holding one chunk's layers.
May assume: a validated pretrain configuration (config.parse) and the chunks of plan/params.py.
"""

from __future__ import annotations


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


def layer_bytes(args, moe: bool) -> float:
    """Bytes one transformer layer keeps for backward per micro-batch on one rank (no full recompute)."""
    s, b, h, kv, _ = _dims(args)
    t, D = args.tensor_model_parallel_size, activation_dtype_bytes(args)
    sp = bool(args.sequence_parallel) or t == 1
    recomputed = _selective_modules(args)
    norm_side = 4 * h  # norm inputs and linear inputs: whole on every TP rank without SP
    attention = (h + 2 * kv) + h  # Q/K/V after RoPE, core attention output
    unfused = "core_attn" not in recomputed and args.attention_backend in ("local", "unfused")
    gated = 2 if args.swiglu else 1
    if moe:
        f = args.moe_ffn_hidden_size or args.ffn_hidden_size
        k = args.moe_router_topk
        mlp = k * (2 * h + gated * f + f)
        if "moe_act" in recomputed:
            mlp -= k * f
        if args.moe_shared_expert_intermediate_size:
            mlp += (gated + 1) * args.moe_shared_expert_intermediate_size
    else:
        mlp = (gated + 1) * args.ffn_hidden_size
        if "mlp" in recomputed:
            mlp = 0
    per_token = (norm_side / (t if sp else 1)) + (attention + mlp) / t
    total = s * b * per_token * D
    if moe:  # the router's fp32 logits and probabilities, every token of the (SP-split) sequence
        total += s * b * args.num_experts * 4 * 2 / (t if sp else 1)
    masks = 0.0
    if args.hidden_dropout > 0:
        masks += 2 * s * b * h / (t if sp else 1)
    if unfused:  # QK^T scores and softmax output in D bytes, the dropout mask in 1 (Korthikanti: 5 a s^2 b at D=2)
        masks += s * b * args.num_attention_heads * s * (2 * D + 1) / t
    return total + masks


def recomputed_layer_input_bytes(args) -> float:
    s, b, h, _, _ = _dims(args)
    t = args.tensor_model_parallel_size
    sp = bool(args.sequence_parallel) or t == 1
    return s * b * h * activation_dtype_bytes(args) / (t if sp else 1)


def chunk_bytes(args, chunk) -> float:
    """One micro-batch through one model chunk: its layers' saved tensors (after full recompute: inputs only)."""
    moe_share = chunk.moe_layers / chunk.layers if chunk.layers else 0.0
    per_layer = (1 - moe_share) * layer_bytes(args, False) + (moe_share * layer_bytes(args, True) if moe_share else 0)
    mtp = chunk.mtp_layers * layer_bytes(args, False)
    if args.recompute_granularity == "full":
        n = chunk.layers if args.recompute_method == "uniform" else min(args.recompute_num_layers or 0, chunk.layers)
        return (chunk.layers - n) * per_layer + n * recomputed_layer_input_bytes(args) + mtp
    return chunk.layers * per_layer + mtp


def recompute_transient(args, stage) -> float:
    """What one layer's backward adds while it runs: full recompute, the layer's activations live again; unfused
    attention, the gradients of its scores and probabilities (2 D bytes per s^2 element), and with selective
    recompute of ``core_attn`` the recomputed scores, probabilities and mask too (2 D + 1)."""
    moe = any(c.moe_layers for c in stage.chunks)  # the larger kind where both are present
    if args.recompute_granularity == "full":
        return layer_bytes(args, moe)
    if args.attention_backend not in ("local", "unfused"):
        return 0.0
    s, b, _, _, _ = _dims(args)
    D = activation_dtype_bytes(args)
    per_element = 2 * D + ((2 * D + 1) if "core_attn" in _selective_modules(args) else 0)
    return s * b * args.num_attention_heads * s * per_element / args.tensor_model_parallel_size


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
