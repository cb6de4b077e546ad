"""Device bytes of one rank of each pipeline stage: weights, gradients, optimizer state, activations, buffers, peak.

- weights: the rank's parameters (plan/params.py) in the parameter dtype (bf16/fp16: 2 bytes, else 4);
- gradients: megatron-core's DDP grad buffer, whole on every rank (the distributed optimizer reduce-scatters into
  it): fp32 with ``--accumulate-allreduce-grads-in-fp32`` (Megatron-LM's rule under ``--bf16`` unless
  ``--grad-reduce-in-bf16``), else the parameter dtype; parameters that need no gradient (a LoRA run's frozen base)
  have none;
- optimizer: Adam's two fp32 moments (SGD: one momentum buffer when momentum > 0) plus fp32 main parameters under
  bf16/fp16; the distributed optimizer shards dense state over data-parallel x context-parallel (per optimizer
  instance) and expert state over the expert data-parallel group; ``--optimizer-cpu-offload`` moves
  ``--optimizer-offload-fraction`` of it to the host (reported, not on the device); frozen parameters have none;
- fully sharded data parallelism (``fsdp_shards``): torch FSDP2 splits weights, gradients and optimizer state over
  data-parallel x context-parallel; Megatron-FSDP what its ``--data-parallel-sharding-strategy`` names (not measured
  on the simulated device: docs/memory.md); the layer whose parameters are gathered at a time is not counted;
- activations: plan/activations.py, times the schedule's in-flight micro-batches;
- buffers: the last stage's logits and vocab-parallel cross-entropy (the logits in the activation dtype and their
  fp32 copy, exponentiated in place and turned into the gradient in place: D + 4 bytes a logit), the pipeline's send/recv
  tensors, MoE dispatch (the permuted top-k token copies sent and received, balanced routing: approximate), the
  first stage's token and position ids.
Peak = the sum: every term is live at the last micro-batch's backward of an iteration after the first (the
optimizer state exists from the first step on). Not modelled (said in the table's notes): FSDP's gathered layer,
the precision-aware optimizer's dtypes, FP8 extras, activation offloading, allocator fragmentation.
May assume: a validated pretrain configuration (config.parse) with its world size.
"""

from __future__ import annotations

import dataclasses

from mtmegatron.plan.activations import activation_dtype_bytes, stage_activation_bytes
from mtmegatron.plan.params import StageParams
from mtmegatron.plan.rank_state import Layout


@dataclasses.dataclass(frozen=True)
class RankMemory:
    stage: int
    params: int
    weights: int
    gradients: int
    optimizer: int
    optimizer_host: int
    activations: int
    buffers: int
    in_flight: int

    @property
    def peak(self) -> int:
        return self.weights + self.gradients + self.optimizer + self.activations + self.buffers


def _param_bytes(args) -> int:
    return 2 if (args.bf16 or args.fp16) else 4


def _optimizer_bytes_per_param(args) -> int:
    moments = 8 if args.optimizer == "adam" else (4 if args.sgd_momentum else 0)
    main = 4 if (args.bf16 or args.fp16) else 0
    return moments + main


def optimizer_bytes(args, stage: StageParams, layout: Layout) -> tuple[int, int]:
    """(on the device, on the host) bytes of this rank's optimizer state."""
    per = _optimizer_bytes_per_param(args)
    dense, expert = (stage.dense - stage.frozen_dense) * per, (stage.expert - stage.frozen_expert) * per
    if args.use_distributed_optimizer:
        dense /= max(layout.dp * layout.cp // args.num_distributed_optimizer_instances, 1)
        expert /= max(layout.expert_dp // args.num_distributed_optimizer_instances, 1)
    total = dense + expert
    host = total * args.optimizer_offload_fraction if args.optimizer_cpu_offload else 0.0
    return int(total - host), int(host)


def buffer_bytes(args, stage: StageParams) -> float:
    s = args.seq_length // args.context_parallel_size
    b, h, t = args.micro_batch_size, args.hidden_size, args.tensor_model_parallel_size
    D = activation_dtype_bytes(args)
    sp = bool(args.sequence_parallel) or t == 1
    total = 0.0
    if any(c.post_process for c in stage.chunks):
        total += s * b * args.padded_vocab_size / t * (D + 4)
    if any(c.pre_process for c in stage.chunks):
        total += s * b * 8 * 2
    if args.pipeline_model_parallel_size > 1:
        total += 2 * s * b * h * D / (t if sp else 1)
    if any(c.moe_layers for c in stage.chunks):
        total += 2 * s * b * args.moe_router_topk * h * D / (t if sp else 1)
    return total


def fsdp_shards(args, layout: Layout) -> tuple[int, int, int]:
    """How many ways (weights, gradients, optimizer state) are split over the data-parallel x context-parallel
    group by fully sharded data parallelism: torch FSDP2 all three; Megatron-FSDP by
    ``--data-parallel-sharding-strategy`` (optim / optim_grads / optim_grads_params; no_shard none); else 1
    (the distributed optimizer's sharding is optimizer_bytes')."""
    n = max(layout.dp * layout.cp, 1)
    if args.use_torch_fsdp2:
        return n, n, n
    if args.use_megatron_fsdp:
        strategy = args.data_parallel_sharding_strategy
        return (n if strategy == "optim_grads_params" else 1, n if strategy.startswith("optim_grads") else 1,
                n if strategy.startswith("optim") else 1)
    return 1, 1, 1


def rank_memory(args, stage: StageParams, layout: Layout) -> RankMemory:
    from mtmegatron.plan.activations import in_flight

    grad_bytes = 4 if (args.accumulate_allreduce_grads_in_fp32 or not (args.bf16 or args.fp16)) else 2
    optimizer, host = optimizer_bytes(args, stage, layout)
    w_shards, g_shards, o_shards = fsdp_shards(args, layout)
    if o_shards > 1 and not args.use_distributed_optimizer:  # FSDP shards the state itself
        optimizer, host = optimizer // o_shards, host // o_shards
    trainable = stage.local - stage.frozen_dense - stage.frozen_expert
    return RankMemory(stage=stage.stage, params=stage.local, weights=stage.local * _param_bytes(args) // w_shards,
                      gradients=trainable * grad_bytes // g_shards, optimizer=optimizer, optimizer_host=host,
                      activations=int(stage_activation_bytes(args, stage)), buffers=int(buffer_bytes(args, stage)),
                      in_flight=in_flight(args, stage.stage))


def megatron_lm_formula(args, layout: Layout, params_total: int | None = None) -> dict[str, float]:
    """Megatron-LM's theoretical_memory_usage.py for the same flags (its accounting, reimplemented from its text):
    the most loaded shard's parameters x 18 bytes (6 + 12 / DP with the distributed optimizer) and
    Korthikanti et al.'s activations (with SP and selective recompute: sbh(18 + 4 f/h) per layer, else its
    "without SP" estimate), in bytes. Dense layers only; its parameter count comes from its own formula."""
    h, L, V = args.hidden_size, args.num_layers, args.padded_vocab_size
    heads = args.num_attention_heads
    kv_ratio = (args.num_query_groups if args.group_query_attention else heads) / heads
    q_ratio = (args.kv_channels or h // heads) * heads / h
    gated = 1.5 if args.swiglu else 1.0
    norm = 1 if args.normalization == "RMSNorm" else 2
    layer = 2 * h * (args.ffn_hidden_size * gated + norm) + 2 * h * h * (1 + kv_ratio) * q_ratio
    embedding = h * V
    block = layer * L + norm * h
    tp, pp = layout.tp, layout.pp
    shard = (block / pp + embedding) / tp
    if args.untie_embeddings_and_output_weights and pp == 1:
        shard += embedding / tp
    per_param = 18 if not args.use_distributed_optimizer else 6 + 12 / layout.dp
    weights_and_optimizer = shard * per_param
    s, b = args.seq_length, args.micro_batch_size
    m = args.num_microbatches
    vpp = args.virtual_pipeline_model_parallel_size
    sp_selective = args.sequence_parallel and args.recompute_granularity == "selective"
    act = s * b * h * ((18 + 4 * args.ffn_hidden_size / h) if sp_selective else (10 + 24 / tp)) * L
    act += 8 * s * b * pp + s * b * h * pp
    if vpp:
        act *= 1 + (pp - 1) / (pp * vpp)
    elif pp > 1:
        act *= min(1, m / pp)
    if sp_selective:
        if pp == 1:
            act += s * b * h * 4 * (1 + V / h)
        act /= tp
    else:
        if pp == 1:
            act += (s * b * V / tp + s * b * h) * 2
        act *= 1.05
    return {"weights_and_optimizer": weights_and_optimizer, "activations": act,
            "total": weights_and_optimizer + act}
