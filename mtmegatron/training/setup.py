"""Process groups, model, optimizer and LR schedule for a pretrain run, all from megatron-core.

The process groups (the default one and megatron-core's model-parallel ones) time out after
``--distributed-timeout-minutes``, as in Megatron-LM.

May assume: flags already validated (arguments.py) and the backend bridge active.
"""

from __future__ import annotations

import datetime
import logging
import os
import random
from functools import partial

import numpy as np
import torch
from megatron.core import parallel_state, tensor_parallel
from megatron.core.distributed import DistributedDataParallel, TorchFullyShardedDataParallel, finalize_model_grads
from megatron.core.distributed.fsdp.mcore_fsdp_adapter import FullyShardedDataParallel
from megatron.core.transformer.module import Float16Module
from torch.distributed.fsdp import CPUOffloadPolicy

from mtmegatron import lora
from mtmegatron.lora.section import Lora
from mtmegatron.models import initialization
from mtmegatron.models.gpt import build_model_chunks, transformer_config
from mtmegatron.backends.device import compute_device, move_module, on_host
from mtmegatron.training import meta_init, overlap
from mtmegatron.training.fsdp_engine import engine
from mtmegatron.training.optimizer import build_optimizer
from mtmegatron.training.schedule import build_scheduler
from mtmegatron.training.section import LrSchedule, Parallel


def init_distributed(args, backend) -> None:
    """``start_process_groups`` for the run's parsed values (the entry points' and tests' call): its ``Parallel``
    section and the virtual pipeline size config/arguments.py derived."""
    start_process_groups(Parallel.of(args), args.virtual_pipeline_model_parallel_size, backend)


def start_process_groups(parallel: Parallel, virtual_pipeline_model_parallel_size: int | None, backend) -> None:
    """The default process group (timing out after ``--distributed-timeout-minutes``), megatron-core's
    model-parallel groups, the logging level and this rank's seeds."""
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    backend.set_device(local_rank)
    if not torch.distributed.is_initialized():
        timeout = datetime.timedelta(minutes=parallel.distributed_timeout_minutes)
        if "RANK" not in os.environ:  # a plain `python -m mtmegatron.pretrain`: one process
            init_lone_process_group(backend.dist_backend, timeout)
        else:
            torch.distributed.init_process_group(backend=backend.dist_backend, timeout=timeout)
    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=parallel.tensor_model_parallel_size,
        pipeline_model_parallel_size=parallel.pipeline_model_parallel_size,
        virtual_pipeline_model_parallel_size=virtual_pipeline_model_parallel_size,
        context_parallel_size=parallel.context_parallel_size,
        expert_model_parallel_size=parallel.expert_model_parallel_size,
        expert_tensor_parallel_size=parallel.expert_tensor_parallel_size,  # None: megatron-core's default, TP
        distributed_timeout_minutes=parallel.distributed_timeout_minutes,
        order=parallel_order(parallel),  # --use-tp-pp-dp-mapping
        num_distributed_optimizer_instances=parallel.num_distributed_optimizer_instances,  # HSDP / partial dist. opt.
    )
    apply_logging_level(parallel)  # --logging-level / MEGATRON_LOGGING_LEVEL
    seed_everything(initialization.rank_seed(parallel))  # Megatron-LM's: --seed + 100 * pipeline rank


def parallel_order(parallel: Parallel) -> str:
    """megatron-core's rank order for initialize_model_parallel (Megatron-LM's initialize.py)."""
    return "tp-cp-ep-pp-dp" if parallel.use_tp_pp_dp_mapping else "tp-cp-ep-dp-pp"


def apply_logging_level(parallel: Parallel) -> int | None:
    """Megatron-LM's rule: ``--logging-level`` wins over ``MEGATRON_LOGGING_LEVEL``; the root logger gets it."""
    level = parallel.logging_level
    if level is None and os.environ.get("MEGATRON_LOGGING_LEVEL") is not None:
        level = int(os.environ["MEGATRON_LOGGING_LEVEL"])
    if level is not None:
        logging.getLogger().setLevel(level)
    return level


def ddp_bucket_size(parallel: Parallel, chunks) -> int:
    """``--ddp-num-buckets``: this rank's parameters (all model chunks) // N, as Megatron-LM's get_model."""
    return sum(p.nelement() for chunk in chunks for p in chunk.parameters()) // parallel.ddp_num_buckets


def init_lone_process_group(dist_backend: str, timeout: datetime.timedelta) -> None:
    """The one-rank default group of a process no launcher started. Its store listens on MASTER_PORT when the
    user set one, else on a port the kernel picks at bind time: a fixed default would make two such runs on one
    box collide, and a port probed free beforehand can be taken by another connection before the bind. The rank
    talks to its own store on the loopback (a MASTER_ADDR left in the shell for a multi-node job may name another
    host). The launcher variables are set afterwards (the store's real port included) for code that reads them."""
    host = "127.0.0.1"
    store = torch.distributed.TCPStore(host, int(os.environ.get("MASTER_PORT", "0")), world_size=1, is_master=True,
                                       timeout=timeout)
    for key, value in (("MASTER_ADDR", host), ("MASTER_PORT", str(store.port)), ("RANK", "0"), ("WORLD_SIZE", "1"),
                       ("LOCAL_RANK", "0")):
        os.environ[key] = value
    torch.distributed.init_process_group(backend=dist_backend, store=store, rank=0, world_size=1, timeout=timeout)


def seed_everything(seed: int) -> None:
    """Seed the host RNGs (python, numpy, torch: ``--use-cpu-initialization`` draws the master weights there,
    identically on every TP rank) and megatron-core's model-parallel RNG tracker (the device init and dropout
    draw from it; models/initialization.py). On the CPU backend the device RNG is the host RNG: the tracker
    seeds it with the same ``seed`` again, so both backends start from the same host state."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    tensor_parallel.model_parallel_cuda_manual_seed(seed)


def build(args):
    """Returns (model chunks wrapped in DDP, Megatron-FSDP or torch FSDP2 (training/fsdp_engine.py), optimizer,
    scheduler, transformer config)."""
    parallel = Parallel.of(args)  # the layout and the data-parallel wrapper's flags (training/section.py)
    config = transformer_config(args)
    with meta_init.birth(config):  # --init-model-with-meta-device: Megatron-FSDP materialises it (meta_init.py)
        chunks = build_model_chunks(args, config)  # on the device, or on the host (models/initialization.py)
    meta_init.check_materialisable(chunks)
    device = compute_device()
    for chunk in chunks if not config.init_model_with_meta_device else ():
        move_module(chunk, device)  # host-initialised parameters (attributes kept) and buffers; else a no-op
    section = Lora.of(args)  # what lora/ reads (lora/section.py)
    if section.lora_r:  # --lora-r: base frozen before DDP and the optimizer see it, adapters attached (lora/wrap.py)
        chunks = lora.wrap(chunks, section, parallel.seed)
        lora.announce(chunks, section)  # the trained vs frozen parameter counts (lora/report.py)
    if config.bf16 or config.fp16:
        chunks = [Float16Module(config, chunk) for chunk in chunks]
    ddp_config = overlap.ddp_config(args)
    if parallel.torch_fsdp2_cpu_offload:  # fully_shard receives it (patches/torch_fsdp2_cpu_offload.py)
        ddp_config.offload_policy = CPUOffloadPolicy(pin_memory=not on_host(device))
    if parallel.ddp_num_buckets is not None:  # Megatron-LM: this rank's parameters // N
        ddp_config.bucket_size = ddp_bucket_size(parallel, chunks)
    wrapper = {"ddp": DistributedDataParallel, "megatron_fsdp": partial(FullyShardedDataParallel, device=device),
               "torch_fsdp2": TorchFullyShardedDataParallel}[engine(parallel)]
    model = [  # Megatron-LM: chunks after the first are not bucketed (their reduce overlaps anyway)
        wrapper(config, ddp_config, chunk, disable_bucketing=(i > 0)) for i, chunk in enumerate(chunks)
    ]
    if wrapper is DistributedDataParallel:  # the FSDP engines shard weights every rank initialised alike
        for chunk in model:
            chunk.broadcast_params()
    optimizer = build_optimizer(args, model, config.params_dtype)  # megatron-core's OptimizerConfig, by field name
    scheduler = build_scheduler(optimizer, LrSchedule.of(args))
    config.finalize_model_grads_func = finalize_model_grads
    config.grad_scale_func = optimizer.scale_loss
    overlap.install_sync_funcs(config, model, parallel)
    return model, optimizer, scheduler, config


def count_parameters(model) -> int:
    """Parameters of the whole model, each counted once: TP-sharded ones summed over TP, replicated ones
    taken from TP rank 0, experts (not all-reduced over DP) summed over EP; then summed over PP."""
    tp_rank = parallel_state.get_tensor_model_parallel_rank()
    dense = torch.zeros(1, dtype=torch.float64, device=compute_device())
    experts = torch.zeros(1, dtype=torch.float64, device=compute_device())
    for chunk in model:
        for p in chunk.parameters():
            if not getattr(p, "allreduce", True):
                # expert weights: sharded over expert-TP, distinct per EP rank
                experts += p.numel()
            elif getattr(p, "tensor_model_parallel", False) or tp_rank == 0:
                dense += p.numel()
    torch.distributed.all_reduce(dense, group=parallel_state.get_tensor_model_parallel_group())
    if parallel_state.get_expert_model_parallel_world_size() > 1 or parallel_state.get_expert_tensor_parallel_world_size() > 1:
        torch.distributed.all_reduce(experts, group=parallel_state.get_expert_tensor_and_model_parallel_group())
    total = dense + experts
    torch.distributed.all_reduce(total, group=parallel_state.get_pipeline_model_parallel_group())
    return int(total.item())
