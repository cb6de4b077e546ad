"""Fine-grained activation offloading: the saved tensors megatron-core's offload manager keeps on the host.

``--fine-grained-activation-offloading --offload-modules M ...`` (megatron-core 0.16's
``pipeline_parallel/fine_grained_activation_offload.py``): inside each named module's offload group, every tensor
saved for backward with at least ``--min-offloaded-tensor-size`` elements (default 2^20) goes to the host in forward
and returns in backward; the last group of each name (the last layer the stage runs before its backward) stays on
the device so that its reload does not block the backward. Per layer and micro-batch, the tensors of each group, in
plan/activations.py's accounting (s = sequence / CP, b = micro-batch, t = TP, D = activation bytes):
- ``attn_norm`` / ``mlp_norm``: the norm's input (s b h, / t with SP; torch's ``RMSNorm`` also its two fp32 copies);
- ``qkv_linear``: linear_qkv's input (the same size);
- ``core_attn``: megatron-core's local attention: Q, the repeated K and V (s b hq / t each) and the probabilities
  (heads / t x b x s^2, D bytes); our SDPA on torch's math kernel: the same in fp32; on a flash kernel: Q, K, V and
  the output; nothing under selective recompute of ``core_attn``;
- ``attn_proj``: linear_proj's input (s b hq / t).
``expert_fc1`` and ``moe_act`` (MoE experts) are not counted (plan/memory.not_modelled says so); full recompute
keeps layer inputs only and nothing is counted as offloaded.
May assume: a validated pretrain configuration (config.parse) whose backend ran the offloading (config/memory_flags.py
turns it off on a backend whose device is the host).
"""

from __future__ import annotations

from mtmegatron.plan.activations import _dims, _selective_modules, activation_dtype_bytes, in_flight, sdpa_kernel

NOT_COUNTED = ("expert_fc1", "moe_act")


def _group_tensors(args, chunk, name: str) -> list[tuple[float, int]]:
    """(elements, bytes an element) of the tensors group ``name`` saves per layer and micro-batch on one rank."""
    s, b, h, kv, head_dim = _dims(args)
    t, D = args.tensor_model_parallel_size, activation_dtype_bytes(args)
    sp = bool(args.sequence_parallel) or t == 1
    tokens, hq, heads = s * b, args.num_attention_heads * head_dim, args.num_attention_heads
    hidden = tokens * h / (t if sp else 1)
    if name in ("attn_norm", "mlp_norm"):
        return [(hidden, D)] + ([(hidden, 4), (hidden, 4)] if getattr(chunk, "torch_rmsnorm", False) and D < 4 else [])
    if name == "qkv_linear":
        return [(hidden, D)]
    if name == "attn_proj":
        return [(tokens * hq / t, D)]
    if name == "core_attn" and "core_attn" not in _selective_modules(args):
        kind = getattr(chunk, "core_attention", "sdpa")
        probs = heads / t * b * s * s
        if kind == "local":
            return [(tokens * hq / t, D)] * 3 + [(probs, D)]
        if kind == "sdpa" and sdpa_kernel(args) == "math":
            return [(tokens * hq / t, 4)] * 3 + [(probs, 4)]
        if kind == "sdpa":
            return [(tokens * hq / t, D), (tokens * kv / t, D), (tokens * kv / t, D), (tokens * hq / t, D)]
    return []


def offloaded_bytes(args, stage) -> float:
    """Activation bytes of stage ``stage`` (plan/params.StageParams) on the host at its peak."""
    if not args.fine_grained_activation_offloading or args.recompute_granularity == "full":
        return 0.0
    chunk = stage.chunks[0]
    per_layer = sum(n * size for name in args.offload_modules for n, size in _group_tensors(args, chunk, name)
                    if n >= args.min_offloaded_tensor_size)
    layers = sum(c.layers for c in stage.chunks) / len(stage.chunks) * in_flight(args, stage.stage)
    return per_layer * max(layers - 1, 0)
