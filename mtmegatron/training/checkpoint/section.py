"""The values training/checkpoint/ reads: where and how checkpoints are saved and loaded (Megatron-LM's
checkpointing flags), and the few values of the run that decide what a checkpoint's optimizer state looks like.
Filled at each ``checkpointing.save``/``load`` and by the loop for the non-persistent checkpoints
(``Checkpoint.of(args)``), compared by value.
The run's whole Namespace is still handed to ``save``/``load``: Megatron-LM's layout stores it as the
checkpoint's ``args`` (megatron_lm_checkpoint.py), and the model's fingerprint, the schedule check, the LoRA
record and ``--load``'s resume rules (utils/checkpoint_dirs.py) are other concerns that read it themselves; the
LoRA switch and ``--lora-load`` are lora/'s ``Lora`` section, built beside this one.
May assume: the flags were parsed and checked (config/checkpoint_flags.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from mtmegatron.utils.section import Section


@dataclass(frozen=True)
class Checkpoint(Section):
    save: str | None                                    # --save: the persistent checkpoints
    load: str | None                                    # --load (a LoRA run: the base the adapters record)
    keep_last: int | None                               # prune all but the newest N after a save
    finetune: bool                                      # load the weights only, start at iteration 0
    no_save_optim: bool
    no_save_rng: bool
    no_load_optim: bool
    no_load_rng: bool
    non_persistent_save_interval: int | None            # a non-persistent save every N iterations
    non_persistent_ckpt_type: str | None                # "global" reads them back on load
    non_persistent_global_ckpt_dir: str | None          # their directory (default <save>/non_persistent)
    use_persistent_ckpt_worker: bool                    # Megatron-LM's async worker: said at start-up
    ckpt_assume_constant_structure: bool                # reuse the first save's plan
    ckpt_fully_parallel_save: bool                      # spread the writes over the DP ranks
    ckpt_fully_parallel_load: bool                      # spread the reads over the DP ranks
    dist_ckpt_strictness: str                           # megatron-core's StrictHandling for missing/unexpected keys
    use_distributed_optimizer: bool                     # the optimizer state's format
    use_torch_fsdp2: bool                               # FSDP2: loads fill the DTensor shards in place
    use_megatron_fsdp: bool                             # Megatron-FSDP: its rows of the same logical checkpoint
    num_experts: int | None                             # MoE: grouped/sequential experts' optimizer state
    moe_grouped_gemm: bool
    global_batch_size: int                              # consumed samples of a checkpoint without the count
