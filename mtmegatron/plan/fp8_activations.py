"""What FP8 changes in the activations a rank keeps: our FP8 linears (fp8/linear.py), per layer and micro-batch.

fp8/linear.py's ``_Fp8Linear`` keeps, for backward, by recipe:
- tensor-scaled (``delayed``, ``tensorwise``): the FP8 copies of the input and of the weight (their transposes
  serve dgrad/wgrad): each linear's input in 1 byte an element instead of D -- a column-parallel linear under SP
  keeps the gathered input (the whole sequence; without FP8 megatron-core keeps the SP shard and gathers again) --
  and one FP8 copy of every weight per micro-batch in flight (1 byte a weight element);
- ``blockwise``: the input as it is and the 128x128-block FP8 weight (1 byte a weight element per micro-batch);
- ``mxfp8``: the input and the weight themselves (nothing more).
Linear inputs in plan/activations.py's accounting: linear_qkv's and linear_fc1's (h each, / t with SP), linear_proj's
(heads x head dim / t) and linear_fc2's (the FFN size / t; an MoE layer's experts see top-k copies). Scales and the
delayed recipe's amax history are small and not counted; ``--first-last-layers-bf16`` is not modelled (every layer
counts as FP8); TransformerEngine's FP8 layers are not modelled (plan/memory.not_modelled says so).
May assume: a validated pretrain configuration (config.parse) with ``--fp8-format`` given.
"""

from __future__ import annotations

from mtmegatron.plan.activations import _dims, activation_dtype_bytes


def ours(args) -> bool:
    """FP8 runs in our linears (not TransformerEngine's layers)."""
    return bool(args.fp8) and not args.transformer_engine_layers


def layer_delta_bytes(args, moe: bool, layer_params: float) -> float:
    """Bytes one layer keeps per micro-batch under FP8 minus what plan/activations.layer_bytes counts without it;
    ``layer_params``: the layer's parameters on this rank (its weights' FP8 copies)."""
    if not ours(args) or args.fp8_recipe == "mxfp8":
        return 0.0
    weights = layer_params * 1.0
    if args.fp8_recipe == "blockwise":
        return weights
    s, b, h, _, head_dim = _dims(args)
    t, D = args.tensor_model_parallel_size, activation_dtype_bytes(args)
    sp = bool(args.sequence_parallel) and t > 1
    copies = args.moe_router_topk if moe else 1
    f = (args.moe_ffn_hidden_size or args.ffn_hidden_size) if moe else args.ffn_hidden_size
    column = 2 * h * (1 - D / (t if sp else 1))  # linear_qkv's and linear_fc1's input: 1 byte, the whole sequence
    row = (args.num_attention_heads * head_dim + copies * f) / t * (1 - D)  # linear_proj's and linear_fc2's
    if moe:
        column = h * (1 - D / (t if sp else 1)) + copies * h * (1 - D)  # the experts' fc1 sees the routed copies
    return s * b * (column + row) + weights


def stage_delta_bytes(args, stage) -> float:
    """FP8's change to stage ``stage``'s (plan/params.StageParams) activations at its peak: every layer in flight
    (full recompute keeps layer inputs only: nothing), each as large as the stage's largest layer."""
    from mtmegatron.plan.activations import in_flight

    if not ours(args) or args.recompute_granularity == "full":
        return 0.0
    moe = any(c.moe_layers for c in stage.chunks)
    layers = sum(c.layers for c in stage.chunks) / len(stage.chunks) * in_flight(args, stage.stage)
    return layers * layer_delta_bytes(args, moe, stage.largest_layer)
