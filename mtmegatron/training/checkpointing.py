"""Checkpoints through megatron-core ``dist_checkpointing`` (so any TP/PP/DP layout can load any other).

Layout (Megatron-LM's): ``<save>/iter_0000010/`` plus ``<save>/latest_checkpointed_iteration.txt``. A
checkpoint is written to ``iter_XXXXXXX.partial`` and renamed only after every rank finished, then the
tracker file is replaced atomically: a crash mid-save never leaves a "latest" that is incomplete. ``load``
takes the newest *complete* checkpoint (the tracker's, or the newest renamed ``iter_*`` directory if the
tracker's is gone); ``--keep-last N`` prunes older ones and stale ``.partial`` directories after each save.
The model fingerprint (models/fingerprint.py) is stored and compared on load, so a checkpoint of another model
is one clear error. ``--load`` of a missing or empty directory starts from scratch (Megatron-LM's ``--save X
--load X`` first run); a directory holding checkpoint debris (a tracker file, ``iter_*`` or ``*.partial``
entries) but no complete checkpoint is an error, and so is ``--finetune`` without a checkpoint. The LR/weight-decay
schedule saved with the optimizer must equal this run's unless ``--override-opt_param-scheduler`` (this run's
flags win) or ``--use-checkpoint-opt_param-scheduler`` (the checkpoint's win) says which to use (schedule.py).
Test hook: ``MTMEGATRON_TEST_PAUSE_IN_SAVE=ITER:RANK`` makes that rank stop inside the save of ``ITER`` (its
shard written, the checkpoint not yet complete) and write ``<save>/paused-rank<RANK>`` with its pid.
May assume: process groups and the model/optimizer exist; called on every rank.
"""

from __future__ import annotations

import os
import random
import re
import shutil
import time

import numpy as np
import torch
from megatron.core import dist_checkpointing, parallel_state, tensor_parallel
from megatron.core.dist_checkpointing.mapping import ShardedObject
from torch.distributed.checkpoint.api import CheckpointException

from mtmegatron.models.fingerprint import describe_mismatches, fingerprint, mismatches
from mtmegatron.training.device import compute_device
from mtmegatron.training.schedule import check_schedule, loadable_state

TRACKER = "latest_checkpointed_iteration.txt"
# The distributed optimizer's default format in megatron-core 0.16 ('fully_sharded_model_space') relies on
# ShardedTensor.flattened_range, which its own validation now rejects; 'fully_reshardable' is the format that
# loads under any TP/PP/DP layout.
OPTIMIZER_METADATA = {"distrib_optim_sharding_type": "fully_reshardable"}
PAUSE_ENV = "MTMEGATRON_TEST_PAUSE_IN_SAVE"
_ITER_DIR = re.compile(r"^iter_(\d{7})$")


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


def _is_complete(directory: str) -> bool:
    # dist_checkpointing writes metadata.json last; the rename from .partial happens after every rank finished
    return os.path.isfile(os.path.join(directory, "metadata.json"))


def complete_iterations(root: str) -> list[int]:
    """Iterations of the complete checkpoints under ``root``, oldest first (``.partial`` ones never count)."""
    if not os.path.isdir(root):
        return []
    found = [int(m.group(1)) for name in os.listdir(root) if (m := _ITER_DIR.match(name))]
    return sorted(it for it in found if _is_complete(checkpoint_dir(root, it)))


def latest_complete_iteration(root: str) -> int | None:
    """The tracker's iteration when that checkpoint is complete, else the newest complete one (a tracker
    update lost in a crash, or a checkpoint deleted by hand), else None."""
    tracked = latest_iteration(root)
    if tracked is not None and _is_complete(checkpoint_dir(root, tracked)):
        return tracked
    complete = complete_iterations(root)
    return complete[-1] if complete else None


def prune(root: str, keep_last: int) -> list[str]:
    """Remove all but the ``keep_last`` newest complete checkpoints and any leftover ``.partial`` directory."""
    removed = [checkpoint_dir(root, it) for it in complete_iterations(root)[:-keep_last]]
    removed += [os.path.join(root, name) for name in os.listdir(root) if name.endswith(".partial")]
    for path in removed:
        shutil.rmtree(path, ignore_errors=True)
    return removed


def _pause_for_test(root: str, iteration: int, rank: int) -> None:
    spec = os.environ.get(PAUSE_ENV, "")
    if spec and spec == f"{iteration}:{rank}":
        with open(os.path.join(root, f"paused-rank{rank}"), "w") as f:
            f.write(str(os.getpid()))
        while True:  # until the test kills this process
            time.sleep(1)


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


def _layout() -> dict:
    return {"tp": parallel_state.get_tensor_model_parallel_world_size(),
            "pp": parallel_state.get_pipeline_model_parallel_world_size()}


def _device_rng_states() -> dict:
    """``{device_type: state of this rank's device generator}``; empty on the cpu backend, whose device RNG is
    the host RNG (saved as "torch")."""
    device = compute_device()
    if device.type == "cpu":
        return {}
    return {device.type: torch.get_device_module(device.type).get_rng_state(device)}


def _restore_device_rng(saved: dict, rank: int) -> None:
    device = compute_device()
    if device.type == "cpu":
        return
    if device.type not in saved:
        if rank == 0:
            print(f"mtmegatron: the checkpoint holds no {device.type} RNG state (saved on "
                  f"{', '.join(saved) or 'the cpu backend'}): the {device.type} generator is not restored", flush=True)
        return
    torch.get_device_module(device.type).set_rng_state(saved[device.type], device)


def _rng_state() -> ShardedObject:
    state = {
        "random": random.getstate(),
        "np": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "device": _device_rng_states(),
        "tracker": tensor_parallel.get_cuda_rng_tracker().get_states(),
    }
    pp, tp = parallel_state.get_pipeline_model_parallel_rank(), parallel_state.get_tensor_model_parallel_rank()
    pp_n, tp_n = parallel_state.get_pipeline_model_parallel_world_size(), parallel_state.get_tensor_model_parallel_world_size()
    return ShardedObject("rng_state", state, (pp_n, tp_n), (pp, tp),
                         replica_id=parallel_state.get_data_parallel_rank(with_context_parallel=True))


def save(root: str, iteration: int, model, optimizer, scheduler, args, train_state: dict | None = None) -> str:
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
    state["args"] = fingerprint(args)
    state["train_state"] = dict(train_state or {})
    state["layout"] = _layout()
    state["distributed_optimizer"] = bool(args.use_distributed_optimizer)
    dist_checkpointing.save(state, partial)
    _pause_for_test(root, iteration, rank)
    torch.distributed.barrier()
    if rank == 0:
        shutil.rmtree(final, ignore_errors=True)
        os.replace(partial, final)
        tmp = os.path.join(root, TRACKER + ".tmp")
        with open(tmp, "w") as f:
            f.write(str(iteration))
        os.replace(tmp, os.path.join(root, TRACKER))
        if getattr(args, "keep_last", None):
            prune(root, args.keep_last)
    torch.distributed.barrier()
    return final


def _materialize_optimizer_state(optimizer) -> None:
    """A fresh DistributedOptimizer has no per-param state (not even 'step'), and its sharded_state_dict
    for loading reads that state to build the template; give it placeholder state, as megatron-core itself
    does for its FSDP format. The placeholders are overwritten by the load."""
    for inner in getattr(optimizer, "chained_optimizers", [optimizer]):
        if hasattr(inner, "_init_optimizer_states_with_dummy_values") and not inner.optimizer.state:
            inner._init_optimizer_states_with_dummy_values()


def _describe(error: BaseException) -> str:
    """The first underlying failure of a (possibly per-rank wrapped) checkpoint error, on one line."""
    failures = getattr(error, "failures", None)  # torch's CheckpointException: {rank: exception}
    if failures:
        rank, error = next(iter(failures.items()))
        if isinstance(error, tuple):  # (exception, its stack summary)
            error = error[0]
        return f"rank {rank}: {_describe(error)}"
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}{': ' + text[0] if text else ''}"


def checkpoint_debris(root: str) -> list[str]:
    """Entries of ``root`` that a save leaves (tracker, ``iter_*``, ``*.partial``): none means a fresh start."""
    if not os.path.isdir(root):
        return []
    return sorted(name for name in os.listdir(root)
                  if name.startswith(TRACKER) or name.startswith("iter_") or name.endswith(".partial"))


def load(root: str, model, optimizer, scheduler, args, train_state: dict | None = None) -> int:
    """Load the latest complete checkpoint under ``root``; returns the iteration to continue from (0, after a
    message, when ``root`` is missing or holds nothing a save writes). ``train_state`` (when given) is updated
    with the counters saved beside the weights."""
    iteration = latest_complete_iteration(root)
    if iteration is None:
        debris = checkpoint_debris(root)
        if not debris and not args.finetune:
            if torch.distributed.get_rank() == 0:
                print(f"mtmegatron: --load {root}: {'empty directory' if os.path.isdir(root) else 'no such directory'}"
                      f", no checkpoint to resume: starting from scratch at iteration 0", flush=True)
            return 0
        found = f"it holds {', '.join(debris[:3])}{' ...' if len(debris) > 3 else ''} but" if debris else "there is"
        raise CheckpointError(f"--load {root}: {found} no complete checkpoint (no {TRACKER} naming a finished "
                              f"iter_* directory){'; --finetune needs one' if args.finetune else ''}; remove the "
                              f"debris of the interrupted save to start from scratch, or pass another --load")
    directory = checkpoint_dir(root, iteration)
    common = dist_checkpointing.load_common_state_dict(directory)
    mismatched = mismatches(common.get("args", {}), args)
    if mismatched:
        raise CheckpointError(f"checkpoint {directory} was written for a different model "
                              f"({describe_mismatches(mismatched)})")
    state = _model_state(model)
    model_only = common.get("model_only", False)  # mtmegatron convert's output: weights only, start at 0
    load_optim = not (args.finetune or args.no_load_optim or model_only)
    load_rng = not (args.finetune or args.no_load_rng or model_only)
    saved_distopt = common.get("distributed_optimizer", bool(args.use_distributed_optimizer))
    if load_optim and saved_distopt != bool(args.use_distributed_optimizer):
        raise CheckpointError(f"checkpoint {directory} holds {'distributed' if saved_distopt else 'plain'}-optimizer "
                              f"state; run with{'' if saved_distopt else 'out'} --use-distributed-optimizer, or "
                              f"pass --no-load-optim to load the weights only")
    saved_layout = common.get("layout", _layout())
    if load_rng and saved_layout != _layout():
        # RNG states are per (PP, TP) rank: they have no meaning under another layout (as in Megatron-LM)
        load_rng = False
        if torch.distributed.get_rank() == 0:
            print(f"mtmegatron: checkpoint layout {saved_layout} differs from this run's {_layout()}: "
                  f"RNG states not restored (dropout masks will differ from the original run)", flush=True)
    if load_optim and "scheduler" in common:
        check_schedule(common["scheduler"], scheduler, args, directory, CheckpointError)
    if load_optim:
        _materialize_optimizer_state(optimizer)
        state["optimizer"] = optimizer.sharded_state_dict(state, is_loading=True, metadata=OPTIMIZER_METADATA)
    if load_rng:
        state["rng_state"] = _rng_state()
    try:
        loaded = dist_checkpointing.load(state, directory)
    # dist_checkpointing raises CheckpointingException, KeyError, RuntimeError, ... and torch's
    # CheckpointException, which is a BaseException
    except (Exception, CheckpointException) as e:
        raise CheckpointError(f"checkpoint {directory} cannot be loaded into this model/layout (damaged files, "
                              f"or written by another model): {_describe(e)}") from e
    for key, chunk in zip(_model_keys(model), model):
        _unwrap(chunk).load_state_dict(loaded[key])
    if load_optim:
        optimizer.load_state_dict(loaded["optimizer"])
        scheduler.load_state_dict(loadable_state(loaded["scheduler"], scheduler))
    else:  # the optimizer's fp32 main copies must follow the freshly loaded weights
        optimizer.reload_model_params()
    if load_rng:
        rng = loaded["rng_state"]
        random.setstate(rng["random"])
        np.random.set_state(rng["np"])
        torch.set_rng_state(rng["torch"])
        _restore_device_rng(rng.get("device", {}), torch.distributed.get_rank())
        tensor_parallel.get_cuda_rng_tracker().set_states(rng["tracker"])
    if train_state is not None and not (args.finetune or model_only):
        train_state.update(common.get("train_state", {}))
    return 0 if args.finetune or model_only else loaded["iteration"]
