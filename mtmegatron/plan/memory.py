"""Device bytes of one rank of each pipeline stage: weights, gradients, optimizer state, activations, buffers, peak.

- weights: the rank's parameters (plan/params.py) in the parameter dtype (bf16/fp16: 2 bytes, else 4);
- gradients: megatron-core's DDP grad buffer, whole on every rank (the distributed optimizer reduce-scatters into
  it): fp32 with ``--accumulate-allreduce-grads-in-fp32`` (Megatron-LM's rule under ``--bf16`` unless
  ``--grad-reduce-in-bf16``), else the parameter dtype; parameters that need no gradient (a LoRA run's frozen base)
  have none;
- optimizer: Adam's two fp32 moments (SGD: one momentum buffer when momentum > 0) plus fp32 main parameters under
  bf16/fp16 (the precision-aware optimizer: in --exp-avg-dtype, --exp-avg-sq-dtype, --main-params-dtype; its
  --main-grads-dtype bf16 keeps the grad buffer in bf16, the gradients' rule above); the distributed optimizer shards dense state over data-parallel x context-parallel (per optimizer
  instance) and expert state over the expert data-parallel group; ``--optimizer-cpu-offload`` moves
  ``--optimizer-offload-fraction`` of it to the host (reported, not on the device); frozen parameters have none;
- fully sharded data parallelism (``fsdp_shards``): torch FSDP2 splits weights, gradients (in the parameter dtype)
  and optimizer state over data-parallel x context-parallel; Megatron-FSDP what its
  ``--data-parallel-sharding-strategy`` names; what they hold gathered at the peak (``fsdp_gathered_bytes``) counts
  with the buffers; ``--torch-fsdp2-cpu-offload`` puts the shards and the optimizer state on the host;
- activations: plan/activations.py, times the schedule's in-flight micro-batches, less what fine-grained activation
  offloading keeps on the host (plan/activation_offload.py), with FP8's input and weight copies
  (plan/fp8_activations.py);
- buffers: the last stage's logits and vocab-parallel cross-entropy (the logits in the activation dtype and their
  fp32 copy, exponentiated in place and turned into the gradient in place: D + 4 bytes a logit), the pipeline's send/recv
  tensors, MoE dispatch (the permuted top-k token copies sent and received, balanced routing: approximate), the
  first stage's token and position ids.
Peak = the sum: every term is live at the last micro-batch's backward of an iteration after the first (the
optimizer state exists from the first step on); under torch FSDP2 the gradients never coexist with the forward's
activations (the larger of the two counts). Not modelled (``not_modelled``: said in the plan's output for the
command lines it concerns): FP8 in TE's layers, TE's per-layer activation offloading and the experts' offload groups,
allocator fragmentation.
May assume: a validated pretrain configuration (config.parse) with its world size.
"""

from __future__ import annotations

import dataclasses

from mtmegatron.plan import fp8_activations
from mtmegatron.plan.activation_offload import NOT_COUNTED, offloaded_bytes
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
    gradients_apart: bool = False  # the gradients never coexist with the forward's activations (torch FSDP2)

    @property
    def peak(self) -> int:
        held = self.weights + self.optimizer + self.buffers
        if self.gradients_apart:  # backward frees activations as the gradients appear: the larger of the two
            return held + max(self.gradients, self.activations)
        return held + self.gradients + self.activations


def _param_bytes(args) -> int:
    return 2 if (args.bf16 or args.fp16) else 4


_DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}


def _optimizer_bytes_per_param(args) -> int:
    """Adam's two moments (SGD: momentum) and the main parameters under bf16/fp16; with the precision-aware
    optimizer in ``--exp-avg-dtype`` / ``--exp-avg-sq-dtype`` / ``--main-params-dtype`` (fp32 by default)."""
    aware = args.use_precision_aware_optimizer
    dtype = (lambda name: _DTYPE_BYTES[str(getattr(args, name))]) if aware else (lambda name: 4)
    if args.optimizer == "adam":
        moments = dtype("exp_avg_dtype") + dtype("exp_avg_sq_dtype")
    else:
        moments = 4 if args.sgd_momentum else 0
    main = dtype("main_params_dtype") if (args.bf16 or args.fp16) else 0
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


def fsdp_gathered_bytes(args, stage: StageParams, layout: Layout) -> int:
    """Parameters fully sharded data parallelism holds gathered (whole, in the parameter dtype) at the peak, on top
    of the rank's shards. torch FSDP2 (megatron-core's wrapper: a ``fully_shard`` unit per transformer layer and
    per embedding, the root unit for the rest): the root unit (output layer, final norm) is not resharded after
    forward, so it stays whole from the first forward to the end of backward, plus the layer unit running.
    Megatron-FSDP with optim_grads_params (units: the transformer layers): the parameters outside any unit
    (embedding, output layer, final norm) are gathered in every forward and released only at the end of
    backward, plus the layer unit running. Other strategies hold parameters whole (no gather)."""
    if max(layout.dp * layout.cp, 1) == 1:
        return 0
    if args.use_torch_fsdp2:
        whole = stage.head + stage.largest_layer
    elif args.use_megatron_fsdp and args.data_parallel_sharding_strategy == "optim_grads_params":
        whole = stage.embedding + stage.head + stage.largest_layer
    else:
        return 0
    return whole * _param_bytes(args)


def rank_memory(args, stage: StageParams, layout: Layout) -> RankMemory:
    from mtmegatron.plan.activations import in_flight

    grad_bytes = 4 if (args.accumulate_allreduce_grads_in_fp32 or not (args.bf16 or args.fp16)) else 2
    if args.use_torch_fsdp2:  # megatron-core's FSDP2 wrapper sets no mixed-precision policy: .grad in the
        grad_bytes = _param_bytes(args)  # parameter dtype, reduce-scattered as it is (no main_grad buffer), and
        # megatron-core's optimizers' zero_grad sets it to None before each step's forward (gradients_apart)
    optimizer, host = optimizer_bytes(args, stage, layout)
    w_shards, g_shards, o_shards = fsdp_shards(args, layout)
    if o_shards > 1 and not args.use_distributed_optimizer:  # FSDP shards the state itself
        optimizer, host = optimizer // o_shards, host // o_shards
    trainable = stage.local - stage.frozen_dense - stage.frozen_expert
    weights, gradients = stage.local * _param_bytes(args) // w_shards, trainable * grad_bytes // g_shards
    if args.torch_fsdp2_cpu_offload and args.use_torch_fsdp2:
        # torch's CPUOffloadPolicy: parameter shards, gradients and the optimizer state (built from the host
        # parameters) live on the host; the device holds the gathered units (not measured: docs/memory.md)
        host, optimizer, weights, gradients = host + optimizer, 0, 0, 0
    return RankMemory(stage=stage.stage, params=stage.local, weights=weights, gradients=gradients,
                      optimizer=optimizer, optimizer_host=host,
                      activations=int(stage_activation_bytes(args, stage) - offloaded_bytes(args, stage)
                                      + fp8_activations.stage_delta_bytes(args, stage)),
                      buffers=int(buffer_bytes(args, stage) + fsdp_gathered_bytes(args, stage, layout)),
                      in_flight=in_flight(args, stage.stage), gradients_apart=bool(args.use_torch_fsdp2))


def not_modelled(args) -> list[str]:
    """What the rows leave out for this command line, said in the plan's output rather than silently wrong."""
    out = []
    if args.fp8 and not fp8_activations.ours(args):
        out.append("FP8 in TransformerEngine's layers (their FP8 input/weight copies and transpose caches): "
                   "activations are counted in the parameter dtype")
    elif args.fp8:
        out.append("FP8's scales and amax history, --first-last-layers-bf16 (every layer counts as FP8)")
    if args.cpu_offloading_num_layers:
        out.append("--cpu-offloading-num-layers (TransformerEngine's offload): the offloaded activations are counted "
                   "as kept on the device (an upper bound)")
    if args.fine_grained_activation_offloading and set(args.offload_modules) & set(NOT_COUNTED):
        out.append(f"activation offloading of {', '.join(sorted(set(args.offload_modules) & set(NOT_COUNTED)))}: "
                   "counted as kept on the device (an upper bound)")
    return out + ["allocator fragmentation"]


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
