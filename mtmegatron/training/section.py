"""The values training/'s top level reads, as typed sections (utils/section.py), each built once where the run
starts that concern (``X.of(args)``) and handed down:

- ``Parallel``: the parallel layout and its process groups (``setup.start_process_groups``; the virtual pipeline
  size is derived at parse time, not a flag, and is passed beside it), the ranks' seeds, and how
  the model chunks are wrapped for data parallelism (DDP, Megatron-FSDP, torch FSDP2: ``setup.build``,
  ``fsdp_engine.engine``, ``overlap``). The wrapper's own values are megatron-core's
  ``DistributedDataParallelConfig`` (``overlap.ddp_config``, filled by field name); this section holds the flags
  read before it exists or that it does not keep unchanged (Megatron-FSDP turns its ``overlap_grad_reduce`` on).
- ``LrSchedule``: the learning-rate / weight-decay schedule (training/schedule.py, schedule_steps.py).
- ``Schedule``: the loop's iterations, batches, intervals and exit conditions, and what one training or
  validation step reads (training/loop.py, train_step.py, evaluate.py).
The optimizer's values are megatron-core's ``OptimizerConfig`` (training/optimizer.py fills it by field name).
May assume: the flags were parsed and checked (config/).
"""

from __future__ import annotations

from dataclasses import dataclass

from mtmegatron.utils.section import Section


@dataclass(frozen=True)
class Parallel(Section):
    tensor_model_parallel_size: int
    pipeline_model_parallel_size: int
    context_parallel_size: int
    expert_model_parallel_size: int
    expert_tensor_parallel_size: int | None             # None: megatron-core's default, TP
    num_distributed_optimizer_instances: int            # HSDP / partial distributed optimizer
    use_tp_pp_dp_mapping: bool                          # the rank order tp-cp-ep-pp-dp instead of ...-dp-pp
    distributed_timeout_minutes: int                    # the process groups' timeout
    logging_level: int | None                           # --logging-level (else MEGATRON_LOGGING_LEVEL)
    seed: int                                           # the ranks' seeds (models/initialization.rank_seed)
    data_parallel_random_init: bool
    use_megatron_fsdp: bool                             # the data-parallel wrapper (fsdp_engine.py)
    use_torch_fsdp2: bool
    torch_fsdp2_cpu_offload: bool                       # FSDP2's CPUOffloadPolicy
    ddp_num_buckets: int | None                         # this rank's parameters // N per bucket
    use_distributed_optimizer: bool                     # with overlap_param_gather: overlap.ParamGather
    overlap_param_gather: bool
    overlap_grad_reduce: bool                           # overlap.install_sync_funcs
    align_grad_reduce: bool


@dataclass(frozen=True)
class LrSchedule(Section):
    lr: float | None
    min_lr: float
    lr_warmup_init: float
    lr_decay_style: str
    lr_wsd_decay_style: str
    lr_warmup_iters: int
    lr_warmup_samples: int
    lr_warmup_fraction: float | None
    lr_decay_iters: int | None
    lr_decay_samples: int | None
    lr_wsd_decay_iters: int | None
    lr_wsd_decay_samples: int | None
    weight_decay: float
    start_weight_decay: float | None
    end_weight_decay: float | None
    weight_decay_incr_style: str
    train_iters: int | None                             # the default decay length (set for --train-samples too)
    train_samples: int | None                           # sample-based training: steps are these samples
    global_batch_size: int                              # iteration-based: steps are iterations x this
    override_opt_param_scheduler: bool                  # on --load: this run's schedule
    use_checkpoint_opt_param_scheduler: bool            # on --load: the checkpoint's schedule


@dataclass(frozen=True)
class Schedule(Section):
    global_batch_size: int
    micro_batch_size: int
    seq_length: int                                     # the schedule's activation shape (a Step may set its own)
    calculate_per_token_loss: bool                      # megatron-core's per-token loss (sft_step.py)
    eval_interval: int | None
    eval_iters: int
    full_validation: bool                               # each set read whole per evaluation
    multiple_validation_sets: bool
    skip_train: bool                                    # validation at the loaded iteration only
    save_interval: int | None
    max_skipped_steps: int | None                       # stop after more inf/nan steps than this
    empty_unused_memory_level: int
    fp16: bool                                          # the optimizer's own inf/nan check instead of ours
    barrier_with_L1_time: bool
    log_num_zeros_in_grad: bool
