"""An analytic step time for one layout, to rank the layouts ``mtmegatron plan --search`` finds to fit.

- compute: the iteration's model FLOPs (forward 2 x the active matmul parameters a token meets -- dense layers,
  top-k of E experts, the output layer -- plus causal attention's 2 s x heads x head-dim per token and layer; x3 for
  forward and backward; full recompute adds the layers' forward again, selective recompute of ``core_attn`` the
  attention part) over every device at the device table's dense BF16 peak x its stated efficiency, stretched by the
  pipeline bubble ``1 + (pp - 1) / (micro-batches x vpp)``;
- communication, bytes one device sends per iteration over the link its group spans (a group within
  ``gpus_per_node`` devices uses the node's link, else the network's; ranks are ordered TP, CP, DP, PP as in
  megatron-core): TP with SP 4 all-gathers/reduce-scatters forward and 4 backward of a micro-batch's activation per
  layer ((t-1)/t of it each; full recompute 2 more); CP's ring passes K and V (c-1) times forward and twice that
  backward; EP's all-to-all dispatch and combine forward and backward ((e-1)/e of the top-k copies); PP one
  activation forward and one gradient backward per micro-batch and virtual stage; DP the gradient all-reduce
  (2 (n-1)/n) or, with the distributed optimizer, its reduce-scatter and the parameters' all-gather, over DP x CP
  (experts over expert-DP); optimizer offload the offloaded shard's gradients down and parameters up the host link.
Nothing overlaps and latency is left out: the figure is an upper bound to compare layouts, not a prediction of
tokens a second. The host's Adam step under offload is not timed.
May assume: ``args`` is a layout's configuration (plan/search.py), ``stage`` its first stage's parameters
(plan/params.StageParams), ``table`` the model's plan/layer_table.LayerTable at its TP and EP sizes.
"""

from __future__ import annotations

from mtmegatron.plan.devices import Device, Link


def model_flops(args, table) -> tuple[float, float, float]:
    """(layer matmul, output layer, attention) forward FLOPs per token of the whole model."""
    tp, ep = args.tensor_model_parallel_size, args.expert_model_parallel_size
    etp = args.expert_tensor_parallel_size or tp
    active = 0.0
    for part in table.layers:
        dense = part.sharded * tp + (part.dense - part.sharded)
        experts = part.expert * ep * etp
        active += dense + (experts * args.moe_router_topk / args.num_experts if experts else 0)
    head = table.word_embedding * tp if table.tied else table.head.sharded * tp
    heads_dim = args.num_attention_heads * (args.kv_channels or args.hidden_size // args.num_attention_heads)
    attention = len(table.layers) * 2 * args.seq_length * heads_dim  # causal: half of 4 s h_q
    return 2 * active, 2 * head, attention


def step_seconds(args, table, stage, device: Device, links: dict[str, Link]) -> dict[str, float]:
    """The parts of one iteration's time, in seconds, and their sum under ``total``."""
    tp, pp, cp = args.tensor_model_parallel_size, args.pipeline_model_parallel_size, args.context_parallel_size
    ep, dp, world = args.expert_model_parallel_size, args.data_parallel_size, args.world_size
    vpp, m, mbs = args.virtual_pipeline_model_parallel_size or 1, args.num_microbatches, args.micro_batch_size
    D = 2 if (args.bf16 or args.fp16) else 4
    node = device.per_node

    def link(span: int) -> float:
        return links[device.intra_link if span <= node else device.inter_link].bytes_per_s

    layers, head, attention = model_flops(args, table)
    per_token = 3 * (layers + head + attention)
    if args.recompute_granularity == "full":
        per_token += layers + attention
    elif args.recompute_granularity == "selective":
        per_token += attention
    tokens = args.global_batch_size * args.seq_length
    out = {"compute": tokens * per_token / (world * device.bf16_flops * device.efficiency)
           * (1 + (pp - 1) / (m * vpp))}
    s = args.seq_length // cp
    act = s * mbs * args.hidden_size * D  # one micro-batch's activation on one CP rank, whole over TP
    stage_layers = len(table.layers) // pp
    moe_layers = sum(c.moe_layers for c in stage.chunks) * vpp // max(len(stage.chunks), 1)
    out["tp"] = 0.0 if tp == 1 else (stage_layers * m * (8 + (4 if args.recompute_granularity == "full" else 0))
                                     * (tp - 1) / tp * act / link(tp))
    groups = args.num_query_groups if args.group_query_attention else args.num_attention_heads
    kv = 2 * s * mbs * groups * (args.kv_channels or args.hidden_size // args.num_attention_heads) * D / tp
    out["cp"] = 0.0 if cp == 1 else stage_layers * m * 3 * (cp - 1) * kv / link(tp * cp)
    out["ep"] = 0.0 if ep == 1 else (moe_layers * m * 4 * (ep - 1) / ep * act * args.moe_router_topk / tp
                                     / link(tp * ep))
    out["pp"] = 0.0 if pp == 1 else 2 * m * vpp * act / tp / link(world)
    grad_bytes = 4 if (args.accumulate_allreduce_grads_in_fp32 or not (args.bf16 or args.fp16)) else 2

    def reduce(params: int, n: int) -> float:
        if n == 1:
            return 0.0
        if args.use_distributed_optimizer:
            return (n - 1) / n * params * (grad_bytes + D)
        return 2 * (n - 1) / n * params * grad_bytes

    expert_dp = world // ((args.expert_tensor_parallel_size or tp) * ep * pp)
    out["dp"] = reduce(stage.dense, dp * cp) / link(tp * cp * dp) + reduce(stage.expert, expert_dp) / link(world // pp)
    shard = stage.dense / max(dp * cp, 1) + stage.expert / max(expert_dp, 1)
    out["offload"] = (shard * args.optimizer_offload_fraction * (4 + D) / links[device.host_link].bytes_per_s
                      if args.optimizer_cpu_offload else 0.0)
    out["total"] = sum(out.values())
    return out
