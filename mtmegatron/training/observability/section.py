"""The values training/observability/ reads: Megatron-LM's logging flags (--log-*, tensorboard, wandb, timers,
the profiler, memory history and reports, --log-progress, --manual-gc) in ``Observability``, and in ``Shape`` the
model's shape that Megatron-LM's FLOP formula (throughput.py) reads. Filled once per run where training starts
(training/loop.py: ``Observability.of(args)``, ``Shape.of(args)``), compared by value.

Why ``Shape`` is a small record of flag dests and not megatron-core's TransformerConfig: Megatron-LM's
``num_floating_point_operations(args, batch_size)`` is a formula over the flags, and several of the values it
reads are not TransformerConfig fields (``padded_vocab_size``, ``seq_length``, ``swiglu``,
``group_query_attention``; the MLA ranks only on MLATransformerConfig), and the progress log counts FLOPs of a
run whose model config it never sees. Reading the same dests keeps the figures identical to Megatron-LM's.
May assume: the flags were parsed and checked (config/observability_flags.py; padded_vocab_size set and
moe_layer_freq parsed to an int or a 0/1 list by the checks).
"""

from __future__ import annotations

from dataclasses import dataclass

from mtmegatron.utils.section import Section


@dataclass(frozen=True)
class Observability(Section):
    log_interval: int                                   # timers report / memory snapshot every N iterations
    train_iters: int                                    # the last iteration also reports the timers
    global_batch_size: int                              # --log-throughput's FLOPs per iteration
    bf16: bool                                          # params_norm over the fp32 main copies (bf16 or fp16)
    fp16: bool
    log_dir: str                                        # default tensorboard/wandb directory
    save: str | None                                    # --log-progress's file; wandb's default directory
    tensorboard_dir: str | None                         # profiler traces (default <log_dir>/tensorboard)
    log_throughput: bool                                # TFLOP/s per device and MFU
    log_params_norm: bool
    log_world_size_to_tensorboard: bool
    log_memory_to_tensorboard: bool
    log_validation_ppl_to_tensorboard: bool
    log_loss_scale_to_tensorboard: bool
    log_timers_to_tensorboard: bool
    timing_log_level: int                               # megatron-core Timers: 0, 1 or 2
    timing_log_option: str                              # "minmax" | "max" | "all"
    barrier_with_L1_time: bool                          # timers synchronise the ranks
    log_memory_interval: int | None                     # one device-memory line every N iterations
    log_device_memory_used: bool                        # that line with the driver's used memory
    record_memory_history: bool                         # the allocator's history (memory_history.py)
    memory_snapshot_path: str                           # where its snapshot goes
    profile: bool
    use_pytorch_profiler: bool
    profile_step_start: int
    profile_step_end: int
    profile_ranks: list                                 # ranks that profile
    log_progress: bool                                  # <save>/progress.txt (progress_log.py)
    wandb_project: str | None                           # wandb off without it
    wandb_entity: str | None
    wandb_exp_name: str | None
    wandb_save_dir: str | None
    manual_gc: bool                                     # automatic gc off, collections at fixed points
    manual_gc_interval: int
    manual_gc_eval: bool


@dataclass(frozen=True)
class Shape(Section):
    """What Megatron-LM's FLOP formula reads of the model (throughput.py)."""

    num_layers: int
    hidden_size: int
    ffn_hidden_size: int
    num_attention_heads: int
    kv_channels: int | None                             # default hidden_size // num_attention_heads
    group_query_attention: bool
    num_query_groups: int | None
    attention_output_gate: bool
    swiglu: bool                                        # three FFN GEMMs instead of two
    seq_length: int
    padded_vocab_size: int                              # the logits GEMM (set by the checks)
    multi_latent_attention: bool
    q_lora_rank: int | None
    kv_lora_rank: int
    qk_head_dim: int
    qk_pos_emb_head_dim: int
    v_head_dim: int
    num_experts: int | None
    moe_layer_freq: int | list                          # every N-th layer MoE, or a 0/1 pattern
    moe_router_topk: int
    moe_ffn_hidden_size: int | None
    moe_shared_expert_intermediate_size: int | None
    mtp_num_layers: int | None
