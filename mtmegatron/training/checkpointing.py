"""Checkpoints through megatron-core ``dist_checkpointing`` (so any TP/PP/DP layout can load any other).

Layout (Megatron-LM's): ``<save>/iter_0000010/`` plus ``<save>/latest_checkpointed_iteration.txt``. A
checkpoint is written to ``iter_XXXXXXX.partial`` and renamed only after every rank finished, then the
tracker file is replaced atomically: a crash mid-save never leaves a "latest" that is incomplete.
May assume: process groups and the model/optimizer exist; called on every rank.
"""

from __future__ import annotations

import os
import random
import shutil

import numpy as np
import torch
from megatron.core import dist_checkpointing, parallel_state, tensor_parallel
from megatron.core.dist_checkpointing.mapping import ShardedObject

TRACKER = "latest_checkpointed_iteration.txt"
# The distributed optimizer's default format in megatron-core 0.16 ('fully_sharded_model_space') relies on
# ShardedTensor.flattened_range, which its own validation now rejects; 'fully_reshardable' is the format that
# loads under any TP/PP/DP layout.
OPTIMIZER_METADATA = {"distrib_optim_sharding_type": "fully_reshardable"}


class CheckpointError(ValueError):
    """A checkpoint that cannot be used as asked (missing, corrupt, other model); the message says why."""


def checkpoint_dir(root: str, iteration: int) -> str:
    return os.path.join(root, f"iter_{iteration:07d}")


def latest_iteration(root: str) -> int | None:
    tracker = os.path.join(root, TRACKER)
    if not os.path.isfile(tracker):
        return None
    with open(tracker) as f:
        text = f.read().strip()
    if not text.isdigit():
        raise CheckpointError(f"{tracker} is corrupt (expected an iteration number, found {text!r})")
    return int(text)


def _unwrap(chunk):
    """The GPTModel inside DDP / Float16Module wrappers (their state dicts would add 'module.' prefixes)."""
    while hasattr(chunk, "module"):
        chunk = chunk.module
    return chunk


def _model_keys(model) -> list[str]:
    return ["model"] if len(model) == 1 else [f"model{i}" for i in range(len(model))]


def _model_state(model) -> dict:
    # dp_cp_group: GPTModel ties the MTP stage's embedding copy over it (MTP on a stage without the embedding)
    metadata = {"dp_cp_group": parallel_state.get_data_parallel_group(with_context_parallel=True)}
    return {key: _unwrap(chunk).sharded_state_dict(metadata=metadata) for key, chunk in zip(_model_keys(model), model)}


def _rng_state() -> ShardedObject:
    state = {
        "random": random.getstate(),
        "np": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "tracker": tensor_parallel.get_cuda_rng_tracker().get_states(),
    }
    pp, tp = parallel_state.get_pipeline_model_parallel_rank(), parallel_state.get_tensor_model_parallel_rank()
    pp_n, tp_n = parallel_state.get_pipeline_model_parallel_world_size(), parallel_state.get_tensor_model_parallel_world_size()
    return ShardedObject("rng_state", state, (pp_n, tp_n), (pp, tp),
                         replica_id=parallel_state.get_data_parallel_rank(with_context_parallel=True))


def save(root: str, iteration: int, model, optimizer, scheduler, args) -> str:
    rank = torch.distributed.get_rank()
    final = checkpoint_dir(root, iteration)
    partial = final + ".partial"
    if rank == 0:
        shutil.rmtree(partial, ignore_errors=True)
        os.makedirs(partial)
    torch.distributed.barrier()
    state = _model_state(model)
    state["optimizer"] = optimizer.sharded_state_dict(state, metadata=OPTIMIZER_METADATA)
    state["rng_state"] = _rng_state()
    state["scheduler"] = scheduler.state_dict()
    state["iteration"] = iteration
    state["args"] = {k: getattr(args, k) for k in ("num_layers", "hidden_size", "num_attention_heads",
                                                   "num_query_groups", "ffn_hidden_size", "vocab_size",
                                                   "num_experts", "swiglu", "normalization")}
    dist_checkpointing.save(state, partial)
    torch.distributed.barrier()
    if rank == 0:
        shutil.rmtree(final, ignore_errors=True)
        os.replace(partial, final)
        tmp = os.path.join(root, TRACKER + ".tmp")
        with open(tmp, "w") as f:
            f.write(str(iteration))
        os.replace(tmp, os.path.join(root, TRACKER))
    torch.distributed.barrier()
    return final


def _materialize_optimizer_state(optimizer) -> None:
    """A fresh DistributedOptimizer has no per-param state (not even 'step'), and its sharded_state_dict
    for loading reads that state to build the template; give it placeholder state, as megatron-core itself
    does for its FSDP format. The placeholders are overwritten by the load."""
    for inner in getattr(optimizer, "chained_optimizers", [optimizer]):
        if hasattr(inner, "_init_optimizer_states_with_dummy_values") and not inner.optimizer.state:
            inner._init_optimizer_states_with_dummy_values()


def load(root: str, model, optimizer, scheduler, args) -> int:
    """Load the latest complete checkpoint under ``root``; returns the iteration to continue from."""
    iteration = latest_iteration(root)
    if iteration is None:
        raise CheckpointError(f"--load {root}: no {TRACKER} there (no complete checkpoint)")
    directory = checkpoint_dir(root, iteration)
    saved_args = dist_checkpointing.load_common_state_dict(directory).get("args", {})
    mismatched = {k: (v, getattr(args, k)) for k, v in saved_args.items() if getattr(args, k) != v}
    if mismatched:
        details = ", ".join(f"{k}: checkpoint {a} vs run {b}" for k, (a, b) in mismatched.items())
        raise CheckpointError(f"checkpoint {directory} was written for a different model ({details})")
    state = _model_state(model)
    model_only = dist_checkpointing.load_common_state_dict(directory).get("model_only", False)  # convert's output
    load_optim = not (args.finetune or args.no_load_optim or model_only)
    load_rng = not (args.finetune or args.no_load_rng or model_only)
    if load_optim:
        _materialize_optimizer_state(optimizer)
        state["optimizer"] = optimizer.sharded_state_dict(state, is_loading=True, metadata=OPTIMIZER_METADATA)
    if load_rng:
        state["rng_state"] = _rng_state()
    loaded = dist_checkpointing.load(state, directory)
    for key, chunk in zip(_model_keys(model), model):
        _unwrap(chunk).load_state_dict(loaded[key])
    if load_optim:
        optimizer.load_state_dict(loaded["optimizer"])
        scheduler.load_state_dict(loaded["scheduler"])
    else:  # the optimizer's fp32 main copies must follow the freshly loaded weights
        optimizer.reload_model_params()
    if load_rng:
        rng = loaded["rng_state"]
        random.setstate(rng["random"])
        np.random.set_state(rng["np"])
        torch.set_rng_state(rng["torch"])
        tensor_parallel.get_cuda_rng_tracker().set_states(rng["tracker"])
    return 0 if args.finetune or model_only else loaded["iteration"]
