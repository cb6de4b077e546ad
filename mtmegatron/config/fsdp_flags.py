"""Fully sharded data parallelism: which engine wraps the model chunks, and the combinations refused.

``--use-megatron-fsdp`` wraps each chunk in megatron-core's Megatron-FSDP (``FullyShardedDataParallel``) with
``--data-parallel-sharding-strategy`` (no_shard | optim | optim_grads | optim_grads_params, a field of
DistributedDataParallelConfig; ``--fsdp-double-buffer`` gives its all-gather and gradient buffers two fixed slots);
``--use-torch-fsdp2`` in megatron-core's ``TorchFullyShardedDataParallel`` (torch's
``fully_shard``), resharding after forward unless ``--torch-fsdp2-no-reshard-after-forward``; otherwise megatron-core's
DistributedDataParallel. ``check_fsdp_args`` refuses, one line each, what megatron-core does not support (Megatron-LM
0.16.1's validate_args rules and its Megatron-FSDP guide), what gloo cannot reduce, flags that would do nothing, and
the checkpoints megatron-core cannot write under an FSDP engine: under FSDP2 ``--save``/``--load`` (torch_dist)
work (training/checkpoint/fsdp_checkpoint.py), under Megatron-FSDP too (training/checkpoint/megatron_fsdp_checkpoint.py); what is left is
refused in ``_checkpoint_refusal``.
May assume: flags parsed and the layout resolved (arguments.CHECKS order); imports nothing from megatron-core.
"""

from __future__ import annotations

import argparse

from mtmegatron.backends import BackendUnavailableError, select_backend
from mtmegatron.models import fusions
from mtmegatron.training.fsdp_engine import engine
from mtmegatron.utils.errors import ConfigError


def add_fsdp_args(p: argparse.ArgumentParser) -> None:
    """mtmegatron's own FSDP flags (Megatron-LM's come from its table: config/megatron_flags.py)."""
    g = p.add_argument_group("fully sharded data parallelism (see docs/memory.md)")
    g.add_argument("--torch-fsdp2-cpu-offload", action="store_true",
                   help="mtmegatron's flag, not Megatron-LM's: with --use-torch-fsdp2, torch's CPUOffloadPolicy "
                        "(pinned where the device has pinned memory) keeps parameter shards, gradients and optimizer "
                        "state on the host, and the optimizer steps there")


def _torch_fsdp2_refusal(args: argparse.Namespace) -> str | None:
    if args.pipeline_model_parallel_size > 1:
        return "not supported with pipeline parallelism (megatron-core's FSDP2 wrapper; as in Megatron-LM)"
    if args.expert_model_parallel_size > 1:
        return "not supported with expert parallelism (megatron-core's FSDP2 wrapper; as in Megatron-LM)"
    if args.use_distributed_optimizer:
        return "shards the optimizer state itself: drop --use-distributed-optimizer (megatron-core's distributed " \
               "optimizer does not run on FSDP2 parameters; as in Megatron-LM)"
    if not args.untie_embeddings_and_output_weights:
        return "needs --untie-embeddings-and-output-weights (megatron-core's FSDP2 wrapper does not support tied " \
               "embedding and output weights; as in Megatron-LM)"
    if args.fp16:
        return "--fp16 is not supported (as in Megatron-LM); use --bf16"
    if fusions.decide(args)["gradient-accumulation"][0]:
        return "needs --no-gradient-accumulation-fusion (megatron-core's FSDP2 wrapper does not support the fused " \
               "weight-gradient accumulation; as in Megatron-LM)"
    if args.overlap_grad_reduce or args.overlap_param_gather:
        return "overlaps its reduce-scatter and all-gather itself: drop --overlap-grad-reduce/--overlap-param-gather"
    return None


# Measured on the tiny Mixtral (4 experts, top-2) at EP2 x DP2 against DDP + the distributed optimizer; the
# optim strategy equals it (tests/parallel/test_fsdp.py).
_SHARDED_GRADS_UNDER_EP = ("megatron-core 0.16.1's Megatron-FSDP adds the reduce-scattered gradient to a buffer that "
                           "already holds it when the expert data-parallel group has one rank (reworked upstream "
                           "after 0.16.1): the expert gradients come out doubled (measured at EP2 x DP2: gradient "
                           "norm 1.182 vs DDP's 1.154 at the first step, losses off by 1e-3 after 5 iterations); use "
                           "--data-parallel-sharding-strategy optim")
_EP_REFUSALS = {
    "no_shard": "megatron-core reduces the gradient norm of Megatron-FSDP's one optimizer over one group, which "
                "for no_shard (the TP/PP group, Megatron-LM's fix) leaves out the expert gradients of the other EP "
                "ranks (measured at EP2: 1.149 vs DDP's 1.154, losses off by 1.8e-4 after 5 iterations); use "
                "--data-parallel-sharding-strategy optim",
    "optim_grads": _SHARDED_GRADS_UNDER_EP,
    "optim_grads_params": _SHARDED_GRADS_UNDER_EP,
}


def _megatron_fsdp_refusal(args: argparse.Namespace) -> str | None:
    if not args.use_distributed_optimizer:
        return "needs --use-distributed-optimizer (megatron-core's optimizer over Megatron-FSDP's buffers; " \
               "Megatron-LM's Megatron-FSDP guide requires both)"
    if args.optimizer_cpu_offload:
        return "--optimizer-cpu-offload: megatron-core 0.16.1's HybridDeviceOptimizer makes plain host copies of the " \
               "optimizer's parameters, which under Megatron-FSDP are DTensors (it fails while it is built: 'got " \
               "mixed torch.Tensor and DTensor'), and Megatron-FSDP has no CPU offload of its own; use " \
               "--use-torch-fsdp2 --torch-fsdp2-cpu-offload, or DDP with --optimizer-cpu-offload"
    if args.data_parallel_sharding_strategy == "optim_grads_params" \
            and args.check_weight_hash_across_dp_replicas_interval is not None:
        return "--check-weight-hash-across-dp-replicas-interval: parameters are sharded with optim_grads_params " \
               "(as in Megatron-LM)"
    if args.expert_model_parallel_size > 1 and args.data_parallel_sharding_strategy != "optim":
        return f"--data-parallel-sharding-strategy {args.data_parallel_sharding_strategy} with " \
               f"--expert-model-parallel-size > 1: {_EP_REFUSALS[args.data_parallel_sharding_strategy]}"
    if args.outer_dp_sharding_strategy == "optim":
        return "--outer-dp-sharding-strategy optim: megatron-core 0.16.1 reduces the gradient norm within one " \
               "optimizer instance (right when the instances hold the same gradients, not when they shard them), " \
               "so clipping differs (measured at DP4 = 2 x 2 with optim_grads_params: gradient norm 0.81 vs DDP's " \
               "1.20 at the first step, losses 7e-3 apart after 5 iterations); use --outer-dp-sharding-strategy " \
               "no_shard (equal to DDP)"
    if args.ddp_average_in_collective and _on_gloo(args):
        return "--ddp-average-in-collective: gloo has no ReduceOp.AVG (drop the flag: the gradients are scaled " \
               "before a SUM)"
    return None


def _on_gloo(args: argparse.Namespace) -> bool:
    try:
        return select_backend(args.backend, warn=False).dist_backend == "gloo"
    except BackendUnavailableError:
        return False  # pretrain reports it with its own message right after parsing


def check_fsdp_args(args: argparse.Namespace) -> None:
    if args.fsdp_double_buffer and not args.use_megatron_fsdp:
        raise ConfigError("--fsdp-double-buffer needs --use-megatron-fsdp (megatron-core's DistributedDataParallel "
                          "does not read it)")
    if args.use_megatron_fsdp and args.use_torch_fsdp2:
        raise ConfigError("--use-megatron-fsdp and --use-torch-fsdp2 are two engines for the same job: give one")
    if args.data_parallel_sharding_strategy != "no_shard" and not args.use_megatron_fsdp:
        raise ConfigError(f"--data-parallel-sharding-strategy {args.data_parallel_sharding_strategy} needs "
                          "--use-megatron-fsdp (megatron-core's DistributedDataParallel does not read it)")
    if not args.torch_fsdp2_reshard_after_forward and not args.use_torch_fsdp2:
        raise ConfigError("--torch-fsdp2-no-reshard-after-forward needs --use-torch-fsdp2")
    _check_torch_fsdp2_cpu_offload(args)
    _check_meta_init_and_hsdp(args)
    if engine(args) == "ddp":
        return
    flag = "--use-torch-fsdp2" if args.use_torch_fsdp2 else "--use-megatron-fsdp"
    why = _torch_fsdp2_refusal(args) if args.use_torch_fsdp2 else _megatron_fsdp_refusal(args)
    if why:
        raise ConfigError(f"{flag}: {why}")
    why = _checkpoint_refusal(args) if args.save or args.load else None
    if why:
        raise ConfigError(f"{flag} with --save/--load: {why}")


def _check_torch_fsdp2_cpu_offload(args: argparse.Namespace) -> None:
    """--torch-fsdp2-cpu-offload: refused without FSDP2; on a backend whose device is the host, a start-up line
    (``args.fsdp_offload_note``) says it has nothing to move."""
    args.fsdp_offload_note = None
    if not args.torch_fsdp2_cpu_offload:
        return
    if not args.use_torch_fsdp2:
        raise ConfigError("--torch-fsdp2-cpu-offload needs --use-torch-fsdp2 (it is torch FSDP2's CPUOffloadPolicy; "
                          "Megatron-FSDP has no CPU offload in megatron-core 0.16.1; DDP + the distributed optimizer "
                          "offloads with --optimizer-cpu-offload)")
    try:
        backend = select_backend(args.backend, warn=False)
    except BackendUnavailableError:
        return  # pretrain reports it with its own message right after parsing
    args.fsdp_offload_note = (
        f"--torch-fsdp2-cpu-offload: nothing to move on the {backend.name} backend (its device is the host memory "
        "the shards would go to); torch's CPUOffloadPolicy still runs, host to host"
        if backend.device_is_host else
        "--torch-fsdp2-cpu-offload: parameter shards, gradients and optimizer state live in pinned host memory "
        "(torch's CPUOffloadPolicy); each layer's shard is copied to the device for its all-gather and the optimizer "
        "steps on the host")


def _check_meta_init_and_hsdp(args: argparse.Namespace) -> None:
    """--init-model-with-meta-device (training/meta_init.py) and HSDP: --num-distributed-optimizer-instances N
    (megatron-core's partial distributed optimizer: the optimizer sharded over DP/N ranks, N replicas; under
    Megatron-FSDP its hybrid FSDP) and --outer-dp-sharding-strategy (Megatron-FSDP's sharding over the N replicas)."""
    meta, instances, outer = args.init_model_with_meta_device, args.num_distributed_optimizer_instances, \
        args.outer_dp_sharding_strategy
    if meta and not args.use_megatron_fsdp:
        raise ConfigError("--init-model-with-meta-device needs --use-megatron-fsdp (only Megatron-FSDP materialises "
                          "and initialises a meta-device model module by module; Megatron-LM's DDP and FSDP2 paths "
                          "only allocate it, uninitialised)")
    if meta and args.data_parallel_sharding_strategy == "no_shard":
        raise ConfigError("--init-model-with-meta-device with --data-parallel-sharding-strategy no_shard: "
                          "megatron-core refuses it (Megatron-FSDP's fully_shard; nothing is sharded, so nothing is "
                          "saved); give optim, optim_grads or optim_grads_params")
    if instances < 1:
        raise ConfigError(f"--num-distributed-optimizer-instances {instances}: give a count >= 1")
    if instances > 1:
        if not args.use_distributed_optimizer:
            raise ConfigError("--num-distributed-optimizer-instances > 1 needs --use-distributed-optimizer (each "
                              "instance is a distributed optimizer over DP/N ranks; as in megatron-core's DDP)")
        dp_cp = args.data_parallel_size * args.context_parallel_size
        if dp_cp % instances:
            raise ConfigError(f"--num-distributed-optimizer-instances {instances} must divide the data-parallel "
                              f"size x context-parallel size ({dp_cp}; megatron-core's parallel_state)")
        if args.ddp_reduce_scatter_with_fp32_accumulation:
            raise ConfigError("--ddp-reduce-scatter-with-fp32-accumulation with --num-distributed-optimizer-instances "
                              "> 1: megatron-core 0.16.1 does not support it (its gradient buffer asserts)")
        if args.use_megatron_fsdp and not args.overlap_grad_reduce:
            raise ConfigError("--num-distributed-optimizer-instances > 1 with --use-megatron-fsdp needs "
                              "--overlap-grad-reduce: megatron-core 0.16.1's Megatron-FSDP all-reduces gradients "
                              "across the instances only on a micro-batch it knows is the last, which only the "
                              "schedule's no_sync (installed with --overlap-grad-reduce, as in Megatron-LM) tells it; "
                              "without it the instances never average (measured at DP4 = 2 x 2: gradient norm 0.79 "
                              "vs DDP's 1.20 at the first step)")
        if args.use_megatron_fsdp and args.data_parallel_sharding_strategy == "optim":
            raise ConfigError("--num-distributed-optimizer-instances > 1 with --data-parallel-sharding-strategy optim: "
                              "megatron-core 0.16.1's Megatron-FSDP gives wrong gradients across the instances "
                              "(measured at DP4 = 2 x 2: gradient norm 1.84 vs DDP's 1.20 at the first step, losses "
                              "2e-3 apart at the second; no_shard and optim_grads equal DDP); use no_shard or "
                              "optim_grads")
        if args.use_megatron_fsdp and args.expert_model_parallel_size > 1:
            raise ConfigError("--num-distributed-optimizer-instances > 1 with --use-megatron-fsdp and "
                              "--expert-model-parallel-size > 1: megatron-core 0.16.1's Megatron-FSDP builds no expert "
                              "device mesh under HSDP (mcore_fsdp_adapter)")
    if outer != "no_shard":
        if not args.use_megatron_fsdp or instances < 2:
            raise ConfigError(f"--outer-dp-sharding-strategy {outer} needs --use-megatron-fsdp and "
                              "--num-distributed-optimizer-instances > 1 (it shards over Megatron-FSDP's outer, "
                              "hybrid data-parallel dimension)")
        if args.data_parallel_sharding_strategy != "optim_grads_params":
            raise ConfigError(f"--outer-dp-sharding-strategy {outer} needs --data-parallel-sharding-strategy "
                              "optim_grads_params (megatron-core's Megatron-FSDP; as in Megatron-LM)")


def _checkpoint_refusal(args: argparse.Namespace) -> str | None:
    """Why checkpoints under this FSDP engine cannot be written or read here (None: they can, torch_dist)."""
    if args.use_megatron_fsdp and (args.num_experts or args.num_distributed_optimizer_instances > 1):
        return ("with --num-experts or --num-distributed-optimizer-instances > 1 (HSDP): mtmegatron writes "
                "Megatron-FSDP checkpoints (training/checkpoint/megatron_fsdp_checkpoint.py) for dense models without hybrid "
                "sharding only; checkpoint these under DDP + --use-distributed-optimizer")
    if (args.tensor_model_parallel_size > 1 or (args.expert_tensor_parallel_size or 1) > 1) and args.swiglu:
        return ("with --tensor-model-parallel-size (or --expert-tensor-parallel-size) > 1 and --swiglu, megatron-core "
                "0.16.1's SwiGLU checkpoint factory takes each rank's fc1 rows for one TP rank's [gate; up], which "
                "FSDP2's and Megatron-FSDP's dim-0 slices of them are not (the checkpoint would hold them out of order); "
                "checkpoint at TP1")
    return None
