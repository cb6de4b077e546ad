"""Checkpoints through megatron-core ``dist_checkpointing`` (so any TP/PP/DP layout can load any other), in
Megatron-LM's torch_dist layout: Megatron-LM's checkpoints load here and ours load in Megatron-LM (what goes
in the common state: megatron_lm_checkpoint.py; the flags: checkpoint_flags.py; docs/checkpoints.md).

Layout: ``<save>/iter_0000010/`` plus ``<save>/latest_checkpointed_iteration.txt``. A checkpoint is written to
``iter_XXXXXXX.partial`` and renamed only after every rank finished, then the tracker file is replaced
atomically: a crash mid-save never leaves a "latest" that is incomplete. ``load`` takes the tracker's
checkpoint (without a tracker, the newest renamed ``iter_*`` directory), or the newer non-persistent one
(non_persistent.py); ``--keep-last N`` (and, in the non-persistent directory, always 1) prunes older ones and
stale ``.partial`` directories after each save, once the new one is tracked. A save that fails on a full disk
is one CheckpointError line naming the directory and its free space, with the ``.partial`` removed. The model
fingerprint (models/fingerprint.py; for a Megatron-LM checkpoint, computed from its Namespace) is compared on
load, so a checkpoint of another model is one clear error. Which ``--load`` starts from scratch (an empty directory; the not yet created ``--save``
directory) and which is refused (a file, a missing directory, debris, a tracker naming a missing checkpoint,
``--finetune``/``--exit-on-missing-checkpoint`` without one, a legacy ``torch``/``torch_dcp`` checkpoint) is
decided by checkpoint_dirs.py, before the process groups start. The LR/weight-decay schedule saved
with the optimizer must equal this run's unless ``--override-opt_param-scheduler`` (this run's flags win) or
``--use-checkpoint-opt_param-scheduler`` (the checkpoint's win) says which to use (schedule.py). The data
position (consumed train/valid samples, training/data.py) is saved in and restored from Megatron-LM's ``args``. Checkpoints of
the older mtmegatron layout (``scheduler`` key, the fingerprint as ``args``) and the converter's model-only
ones still load.
Test hook: ``MTMEGATRON_TEST_PAUSE_IN_SAVE=ITER:RANK`` makes that rank stop inside the save of ``ITER`` (its
shard written, the checkpoint not yet complete) and write ``<save>/paused-rank<RANK>`` with its pid;
``MTMEGATRON_TEST_ENOSPC_IN_SAVE=ITER`` makes rank 0's save of ``ITER`` fail with ENOSPC (a full disk where no
small filesystem can be mounted).
May assume: process groups and the model/optimizer exist; called on every rank.
"""

from __future__ import annotations

import errno
import logging
import os
import random
import shutil
import time

import numpy as np
import torch
from megatron.core import dist_checkpointing, parallel_state, tensor_parallel
from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer
from megatron.core.dist_checkpointing.mapping import ShardedObject
from megatron.core.dist_checkpointing.serialization import (get_default_load_sharded_strategy,
                                                            get_default_save_sharded_strategy)
from megatron.core.dist_checkpointing.strategies.fully_parallel import (FullyParallelLoadStrategyWrapper,
                                                                        FullyParallelSaveStrategyWrapper)
from torch.distributed.checkpoint.api import CheckpointException

from mtmegatron.lora import checkpoint as lora_checkpoint
from mtmegatron.lora.section import Lora
from mtmegatron.models.fingerprint import describe_mismatches, fingerprint, mismatches
from mtmegatron.utils.checkpoint_dirs import (TRACKER, CheckpointError, check_load, checkpoint_dir, complete_iterations,
                                             latest_complete_iteration, resume_point)
from mtmegatron.training.checkpoint import megatron_lm_checkpoint as mlm
from mtmegatron.training.checkpoint import fsdp_checkpoint
from mtmegatron.training.checkpoint import megatron_fsdp_checkpoint
from mtmegatron.training.checkpoint import non_persistent
from mtmegatron.training.checkpoint import plain_to_distributed_optimizer
from mtmegatron.training.checkpoint.section import Checkpoint
from mtmegatron.training.resilience import rerun
from mtmegatron.training.resilience.section import Resilience
from mtmegatron.backends.device import compute_device, on_host
from mtmegatron.training.schedule import check_schedule, loadable_state

# The sharded-state metadata of checkpoints of the older mtmegatron layout (read only; new checkpoints store
# Megatron-LM's content metadata). megatron-core 0.16's default distributed-optimizer format
# ('fully_sharded_model_space') relies on ShardedTensor.flattened_range, which its own validation rejects.
OPTIMIZER_METADATA = {"distrib_optim_sharding_type": "fully_reshardable"}
PAUSE_ENV = "MTMEGATRON_TEST_PAUSE_IN_SAVE"
ENOSPC_ENV = "MTMEGATRON_TEST_ENOSPC_IN_SAVE"
def prune(root: str, keep_last: int, saved: int | None = None) -> list[str]:
    """Remove all but the ``keep_last`` newest complete checkpoints (never ``saved``, the one just written and
    tracked, even where a newer one is left from an abandoned run) and any leftover ``.partial`` or ``.old``
    directory."""
    kept = set(complete_iterations(root)[-keep_last:]) | {saved}
    removed = [checkpoint_dir(root, it) for it in complete_iterations(root) if it not in kept]
    removed += [os.path.join(root, name) for name in os.listdir(root) if name.endswith((".partial", ".old"))]
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


def _sharded_metadata(content: dict) -> dict:
    """The metadata the model's and optimizer's ``sharded_state_dict`` take: the checkpoint's content metadata
    plus the DP x CP group (GPTModel ties the MTP stage's embedding copy over it)."""
    return {**content, "dp_cp_group": parallel_state.get_data_parallel_group(with_context_parallel=True)}


def _model_state(model, metadata: dict) -> dict:
    return {key: _unwrap(chunk).sharded_state_dict(metadata=metadata) for key, chunk in zip(_model_keys(model), model)}


def _layout() -> dict:
    return {"tp": parallel_state.get_tensor_model_parallel_world_size(),
            "pp": parallel_state.get_pipeline_model_parallel_world_size()}


def _device_rng_states() -> dict:
    """``{device_type: state of this rank's device generator}``; empty on the cpu backend, whose device RNG is
    the host RNG (saved as "torch"). Checkpoints of the older layout only."""
    device = compute_device()
    if on_host(device):
        return {}
    return {device.type: torch.get_device_module(device.type).get_rng_state(device)}


def _restore_device_rng(saved: dict, rank: int) -> None:
    device = compute_device()
    if on_host(device):
        return
    if device.type not in saved:
        if rank == 0:
            print(f"mtmegatron: the checkpoint holds no {device.type} RNG state (saved on "
                  f"{', '.join(saved) or 'the cpu backend'}): the {device.type} generator is not restored", flush=True)
        return
    torch.get_device_module(device.type).set_rng_state(saved[device.type], device)


def _legacy_rng_state() -> ShardedObject:
    """The RNG template of the older mtmegatron layout (read only: loads of checkpoints written before it)."""
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


def _restore_legacy_rng(rng: dict) -> None:
    random.setstate(rng["random"])
    np.random.set_state(rng["np"])
    torch.set_rng_state(rng["torch"])
    _restore_device_rng(rng.get("device", {}), torch.distributed.get_rank())
    tensor_parallel.get_cuda_rng_tracker().set_states(rng["tracker"])


class _WorkerErrorRaised(logging.Filter):
    """megatron-core's async writer logs "Local process N encountered an error: ..." and then raises that same
    exception, which reaches ``save``: a full disk becomes its one line (whatever the writer's words: ENOSPC, or
    torch's zip writer's "unexpected pos" after a short write), anything else is re-raised with its traceback. The
    logged copy only adds a second, unexplained line, so it is dropped."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not ("No space left on device" in message
                    or (message.startswith("Local process ") and " encountered an error: " in message))


logging.getLogger("megatron.core.dist_checkpointing.strategies.filesystem_async").addFilter(_WorkerErrorRaised())
_SAVE_STRATEGY: dict = {}  # --ckpt-assume-constant-structure: the first save's strategy, reused by later ones


def _save_strategy(checkpoint: Checkpoint, run: int):
    """megatron-core's torch_dist save strategy, spread over the DP ranks unless --no-ckpt-fully-parallel-save
    (as Megatron-LM); with --ckpt-assume-constant-structure the plan of the run's first save is reused (``run``:
    the identity of the run's args, the same object at each of its saves)."""
    if checkpoint.ckpt_assume_constant_structure and run in _SAVE_STRATEGY:
        return _SAVE_STRATEGY[run], False
    strategy = get_default_save_sharded_strategy("torch_dist")
    if checkpoint.ckpt_assume_constant_structure:
        strategy.use_cached_ckpt_structure = True
    if checkpoint.ckpt_fully_parallel_save:
        strategy = FullyParallelSaveStrategyWrapper(strategy, parallel_state.get_data_parallel_group(
            with_context_parallel=True), checkpoint.ckpt_assume_constant_structure)
    if checkpoint.ckpt_assume_constant_structure:
        _SAVE_STRATEGY.clear()
        _SAVE_STRATEGY[run] = strategy
    return strategy, True


def _in_process_write_results() -> None:
    """megatron-core's torch_dist writer collects its write results in a queue served by a multiprocessing
    Manager (a spawned server process), made for async saves whose writer runs in another process. Saves here
    are synchronous (``--async-save`` is refused), so a plain in-process queue serves; without it a rank killed
    during a save (SIGKILL) leaves its Manager server orphaned, holding the launcher's output pipes open."""
    import queue

    from megatron.core.dist_checkpointing.strategies import filesystem_async

    if getattr(filesystem_async, "_results_queue", "absent") is None:
        filesystem_async._results_queue = queue.Queue()


def save(root: str, iteration: int, model, optimizer, scheduler, args, train_state: dict | None = None) -> str:
    """Write ``<root>/iter_<iteration>`` in Megatron-LM's torch_dist layout (megatron_lm_checkpoint.py) into
    ``iter_<iteration>.partial``, rename it once every rank finished, replace the tracker, then prune
    (``non_persistent.kept``: one in the non-persistent directory, else ``--keep-last``); returns the directory.
    A full disk is a CheckpointError naming the directory and its free space, the ``.partial`` removed.
    ``args``: the run's flags, stored whole as Megatron-LM's ``args``; what this package reads of them is its
    ``Checkpoint`` section (section.py), built here."""
    checkpoint = Checkpoint.of(args)
    try:
        return _save(root, iteration, model, optimizer, scheduler, args, checkpoint, train_state)
    except (Exception, CheckpointException) as e:  # torch's CheckpointException is a BaseException
        if isinstance(e, CheckpointError):
            raise
        where = (f"--save {root}" if checkpoint.save and os.path.realpath(root) == os.path.realpath(checkpoint.save)
                 else f"checkpoint directory {root}")  # the non-persistent one, or --ckpt-convert-save's
        line = _full_disk(e, root, where)
        if line is None:
            raise
        raise CheckpointError(line) from e


_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)
_PEER_GONE = "Connection closed by peer"  # gloo's words when another rank's process ended


def _causes(error: BaseException):
    """``error``, its causes and contexts, and the per-rank failures torch's CheckpointException carries."""
    seen, stack = set(), [error]
    while stack:
        e = stack.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        stack += [e.__cause__, e.__context__]
        for failure in (getattr(e, "failures", None) or {}).values():  # {rank: exception or (exception, stack)}
            stack.append(failure[0] if isinstance(failure, tuple) else failure)


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def _full_disk(error: BaseException, root: str, where: str) -> str | None:
    """The one line for a save that failed on a full disk (or quota), else None. megatron-core's writer wraps
    the OSError in RuntimeError("Worker failure: ...") and torch's CheckpointException; torch.save of common.pt
    says only "file write failed": a failed save with under 1 MiB left on the device counts as a full disk. On
    the other ranks a save that failed because rank 0 failed is a line too (rank 0 prints its own)."""
    errors = list(_causes(error))
    said = any(getattr(e, "errno", None) in _NO_SPACE or "No space left on device" in str(e) for e in errors)
    try:
        usage = shutil.disk_usage(root)
    except OSError:
        usage = None
    rank = torch.distributed.get_rank()
    if not said and (usage is None or usage.free >= 2**20):
        # rank 0 alone writes common.pt, metadata.json and the tracker: when that fails it exits with the line
        # above, and the other ranks, inside a collective, see it fail or its connection close
        if rank != 0 and any(isinstance(e, CheckpointException) or _PEER_GONE in str(e) for e in errors):
            return f"saving a checkpoint in {root} failed on another rank (rank 0 says why)"
        return None
    if rank == 0:  # the save's own debris; the checkpoints before it are untouched
        for name in os.listdir(root):
            if name.endswith(".partial"):
                shutil.rmtree(os.path.join(root, name), ignore_errors=True)
        if os.path.exists(os.path.join(root, TRACKER + ".tmp")):
            os.remove(os.path.join(root, TRACKER + ".tmp"))
    complete = complete_iterations(root)
    tracked = latest_complete_iteration(root) if complete else None
    size = (sum(e.stat().st_size for e in os.scandir(checkpoint_dir(root, tracked)) if e.is_file())
            if tracked is not None else None)
    return (f"{where}: no space left on the device while saving a checkpoint ("
            f"{_mib(usage.free) + ' free of ' + _mib(usage.total) if usage else 'free space unknown'}"
            f"{'; a checkpoint here takes ' + _mib(size) if size else ''}): the unfinished save was removed; "
            + (f"iteration {tracked} stays the latest checkpoint" if tracked is not None else "no checkpoint there")
            + "; free space or give --save another directory, then resume with --load")


def _save(root: str, iteration: int, model, optimizer, scheduler, args, checkpoint: Checkpoint,
          train_state: dict | None) -> str:
    lora = Lora.of(args)
    rank = torch.distributed.get_rank()
    final = checkpoint_dir(root, iteration)
    partial = final + ".partial"
    if rank == 0:
        shutil.rmtree(partial, ignore_errors=True)
        os.makedirs(partial)
    torch.distributed.barrier()
    train_state = dict(train_state or {})
    content = mlm.content_metadata(bool(checkpoint.use_distributed_optimizer))
    metadata = _sharded_metadata(content)
    if megatron_fsdp_checkpoint.applies(checkpoint):  # the same logical checkpoint as DDP + the distributed optimizer's
        state = megatron_fsdp_checkpoint.sharded_state(model, _model_keys(model), None if checkpoint.no_save_optim
                                                       else optimizer, metadata)
    else:
        state = _model_state(model, metadata)
    if lora.lora_r:  # a LoRA run writes its adapters, never the frozen base (lora/checkpoint.py)
        state = lora_checkpoint.select(state, _model_keys(model), "adapters")
    if not checkpoint.no_save_optim:
        if "optimizer" not in state:
            state["optimizer"] = optimizer.sharded_state_dict(state, metadata=metadata)
        state["opt_param_scheduler"] = scheduler.state_dict()
    if not checkpoint.no_save_rng:
        state["rng_state"] = mlm.rng_state_object()
    position = {key: train_state.pop(key) for key in mlm.DATA_POSITION if key in train_state}  # into "args"
    state["args"] = mlm.saved_namespace(args, iteration, torch.distributed.get_world_size(), position)
    rerun_state = rerun.checkpoint_state(Resilience.of(args))  # only while a step waits to be re-run (training/resilience/rerun.py)
    if rerun_state:
        state["rerun_state_machine"] = rerun_state
    state["checkpoint_version"] = mlm.CHECKPOINT_VERSION
    state["iteration"] = iteration
    state["num_floating_point_operations_so_far"] = train_state.pop("num_floating_point_operations_so_far", 0)
    state[mlm.OURS] = {"fingerprint": fingerprint(args), "train_state": train_state, "layout": _layout(),
                       "distributed_optimizer": bool(checkpoint.use_distributed_optimizer)}
    if lora.lora_r:
        state[mlm.OURS]["lora"] = lora_checkpoint.record(lora, checkpoint.load, args)
    strategy, validate = _save_strategy(checkpoint, id(args))
    _in_process_write_results()
    if os.environ.get(ENOSPC_ENV) == str(iteration) and rank == 0:  # test hook: a full disk where none can be made
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), os.path.join(partial, "common.pt"))
    dist_checkpointing.save(state, partial, strategy, validate_access_integrity=validate, content_metadata=content)
    _pause_for_test(root, iteration, rank)
    torch.distributed.barrier()
    if rank == 0:
        if os.path.isdir(final):  # a re-save of this iteration: set aside, so that a crash leaves one of the two
            shutil.rmtree(final + ".old", ignore_errors=True)
            os.replace(final, final + ".old")
        os.replace(partial, final)
        tmp = os.path.join(root, TRACKER + ".tmp")
        with open(tmp, "w") as f:
            f.write(str(iteration))
        os.replace(tmp, os.path.join(root, TRACKER))
        shutil.rmtree(final + ".old", ignore_errors=True)
        keep = non_persistent.kept(checkpoint, root)
        if keep:
            prune(root, keep, iteration)
    torch.distributed.barrier()
    return final


def _materialize_optimizer_state(optimizer) -> None:
    """A fresh DistributedOptimizer has no per-param state (not even 'step'), and its sharded_state_dict
    for loading reads that state to build the template; give it placeholder state, as megatron-core itself
    does for its FSDP format. The placeholders are overwritten by the load."""
    for inner in getattr(optimizer, "chained_optimizers", [optimizer]):
        if hasattr(inner, "_init_optimizer_states_with_dummy_values") and not inner.optimizer.state:
            inner._init_optimizer_states_with_dummy_values()


# what tells megatron-core's param groups apart, less the expert-parallel flag (optimizer.py's identifier keys)
_GROUP_KEYS = ("wd_mult", "lr_mult", "is_decoupled_lr")


def _one_optimizer(entry) -> bool:
    """An optimizer's own state: Float16Optimizer's and DistributedOptimizer's hold ``optimizer``, FP32Optimizer's
    (an fp32 run's plain optimizer) is torch's ``state`` + ``param_groups``."""
    return isinstance(entry, dict) and ("optimizer" in entry or "param_groups" in entry)


def _saved_optimizers(state) -> list[dict]:
    """The per-optimizer entries of an optimizer state (common part): a chained optimizer's ``{0: .., 1: ..}``,
    or the one optimizer's own dict."""
    if isinstance(state, dict) and not _one_optimizer(state):
        return [state[k] for k in sorted(k for k in state if isinstance(k, int)) if _one_optimizer(state[k])]
    return [state] if state else []


def _check_optimizer_count(common: dict, optimizer, sharding, directory: str) -> None:
    """Megatron-LM keeps a dense and an expert-parallel optimizer (a ChainedOptimizer) when experts are split
    over EP ranks, one optimizer under EP1: the count changes with EP. The fully reshardable format keys the
    tensor state by parameter, so it regroups (``_regroup_optimizers``); the other formats do not."""
    saved = len(_saved_optimizers(common.get("optimizer")))
    ours = len(getattr(optimizer, "chained_optimizers", [optimizer]))
    if saved and saved != ours and sharding not in DistributedOptimizer.checkpoint_fully_reshardable_formats:
        state = f"'{sharding}'" if sharding else "non-distributed optimizer"
        raise CheckpointError(f"checkpoint {directory} holds {saved} optimizers ({state} state: dense and "
                              f"expert-parallel ones are separate only under expert parallelism), this run {ours}: "
                              f"run with the checkpoint's --expert-model-parallel-size (1 or more than 1 as it was), "
                              f"or pass --no-load-optim")


def _regroup_optimizers(loaded: dict, optimizer) -> dict:
    """The loaded optimizer state in this run's chaining. dist_checkpointing gives the checkpoint's common part
    (param groups: step, lr; one entry per optimizer that wrote it) merged with this run's tensor state (one
    ``param_state`` per optimizer of this run, keyed by parameter in the fully reshardable format). When the two
    counts differ (EP>1 on one side only), each group of each of this run's optimizers takes the checkpoint's
    group of the same (wd_mult, lr_mult, is_decoupled_lr), whichever optimizer held it."""
    inner = list(getattr(optimizer, "chained_optimizers", [optimizer]))
    saved = _saved_optimizers({k: v for k, v in loaded.items() if k != "param_state"})
    if len(saved) == len(inner) or not saved:
        return loaded
    pool = {}
    for entry in saved:
        for group in entry["optimizer"]["param_groups"]:
            pool.setdefault(tuple(group.get(k) for k in _GROUP_KEYS), group)
    states = [loaded["param_state"]] if len(inner) == 1 else [loaded[i]["param_state"] for i in range(len(inner))]
    entries = []
    for opt, param_state in zip(inner, states):
        groups = [{**pool[tuple(g.get(k) for k in _GROUP_KEYS)], "is_expert_parallel": g["is_expert_parallel"]}
                  for g in opt.optimizer.param_groups]
        entries.append({**{k: v for k, v in saved[0].items() if k != "optimizer" and not isinstance(k, int)},
                        "optimizer": {**saved[0]["optimizer"], "param_groups": groups}, "param_state": param_state})
    return entries[0] if len(entries) == 1 else dict(enumerate(entries))


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


def _saved_facts(common: dict, checkpoint: Checkpoint) -> dict:
    """What a checkpoint holds, from its common state, for Megatron-LM's layout and for the older mtmegatron
    layout (``scheduler`` key, fingerprint dict as ``args``; the converter's model-only checkpoints)."""
    if mlm.is_megatron_lm_layout(common):
        ns, ours = common["args"], common.get(mlm.OURS)
        train_state = dict(ours["train_state"]) if ours else {}
        train_state["num_floating_point_operations_so_far"] = common.get("num_floating_point_operations_so_far", 0)
        train_state.update({key: getattr(ns, key) for key in mlm.DATA_POSITION if getattr(ns, key, None)})
        return {
            "fingerprint": mlm.recorded_fingerprint(common),
            "scheduler": common.get("opt_param_scheduler"),
            "has_optim": "opt_param_scheduler" in common and not getattr(ns, "no_save_optim", False),
            "has_rng": not getattr(ns, "no_save_rng", False),
            "distributed_optimizer": bool(getattr(ns, "use_distributed_optimizer", False)),
            "grouped_experts": getattr(ns, "moe_grouped_gemm", None),
            "layout": {"tp": getattr(ns, "tensor_model_parallel_size", 1),
                       "pp": getattr(ns, "pipeline_model_parallel_size", 1)},
            "content": dist_checkpointing.load_content_metadata(preloaded_state_dict=common) or {},
            "train_state": train_state, "model_only": False, "megatron_lm_layout": True,
            "written_by": "mtmegatron" if ours else "Megatron-LM",
        }
    model_only = common.get("model_only", False)  # mtmegatron convert's output: weights only, start at 0
    return {
        "fingerprint": mlm.recorded_fingerprint(common), "scheduler": common.get("scheduler"),
        "has_optim": not model_only, "has_rng": not model_only,
        "distributed_optimizer": common.get("distributed_optimizer", bool(checkpoint.use_distributed_optimizer)),
        "layout": common.get("layout", _layout()), "content": dict(OPTIMIZER_METADATA), "grouped_experts": None,
        "train_state": common.get("train_state", {}), "model_only": model_only, "megatron_lm_layout": False,
        "written_by": "mtmegatron",
    }


def _check_experts_optimizer_state(saved: dict, checkpoint: Checkpoint, load_optim: bool, directory: str) -> None:
    """The model weights convert between megatron's sequential and grouped experts; the distributed optimizer's
    state does not (GroupedMLP keeps its weights transposed in one flat tensor per rank)."""
    grouped = saved["grouped_experts"]
    if (load_optim and checkpoint.num_experts and checkpoint.use_distributed_optimizer and grouped is not None
            and bool(grouped) != bool(checkpoint.moe_grouped_gemm)):
        raise CheckpointError(f"checkpoint {directory} holds the distributed-optimizer state of "
                              f"{'grouped' if grouped else 'sequential'} MoE experts, which does not convert to "
                              f"{'sequential' if grouped else 'grouped'} ones: run with{'' if grouped else 'out'} "
                              f"--moe-grouped-gemm, or pass --no-load-optim to load the weights only")


def _load_strategy(directory: str, checkpoint: Checkpoint):
    if not checkpoint.ckpt_fully_parallel_load:
        return None
    return FullyParallelLoadStrategyWrapper(get_default_load_sharded_strategy(directory),
                                            parallel_state.get_data_parallel_group(with_context_parallel=True))


def _say(text: str) -> None:
    if torch.distributed.get_rank() == 0:
        print(f"mtmegatron: {text}", flush=True)


def load(root: str, model, optimizer, scheduler, args, train_state: dict | None = None) -> int:
    """Load the latest complete checkpoint under ``root`` (ours or Megatron-LM's); returns the iteration to
    continue from (0, after a message, when ``root`` is missing or holds nothing a save writes). ``train_state``
    (when given) is updated with the counters saved beside the weights. A LoRA run (``--lora-r``) loads the base
    weights from ``root`` (starting over), then, with ``--lora-load``, its adapters and their optimizer state,
    RNG, schedule and iteration from there (lora/checkpoint.py). ``args`` as for ``save``."""
    checkpoint, lora = Checkpoint.of(args), Lora.of(args)
    if not lora.lora_r:
        return _load(root, model, optimizer, scheduler, args, checkpoint, lora, train_state, None)
    _load(root, model, optimizer, scheduler, args, checkpoint, lora, None, "base")
    if not lora.lora_load:
        return 0
    return _load(lora.lora_load, model, optimizer, scheduler, args, checkpoint, lora, train_state, "adapters")


def _load(root: str, model, optimizer, scheduler, args, checkpoint: Checkpoint, lora: Lora,
          train_state: dict | None, part: str | None) -> int:
    """``load`` of one checkpoint; ``part``: None (all of it), "base" (a LoRA run's frozen weights) or
    "adapters" (a LoRA run's own checkpoint)."""
    point = resume_point(root, args)  # the newer of the persistent and the non-persistent checkpoint
    if point is None:  # anything but a fresh start was refused before the process groups started; again here
        check_load(root, args, CheckpointError)  # in case the directory changed since
        _say(f"--load {root}: {'empty directory' if os.path.isdir(root) else 'no such directory'}, no "
             f"checkpoint to resume: starting from scratch at iteration 0")
        return 0
    if point[0] != root:
        _say(f"--load {root}: the non-persistent checkpoint in {point[0]} is the newest")
    elif checkpoint.non_persistent_ckpt_type != "global" and (
            unread := [it for it in complete_iterations(non_persistent.directory(checkpoint, root)) if it > point[1]]):
        _say(f"--load {root}: {non_persistent.directory(checkpoint, root)} holds a newer non-persistent checkpoint "
             f"(iteration {unread[-1]}), read only with --non-persistent-ckpt-type global (as Megatron-LM)")
    root, iteration = point
    if newer := [it for it in complete_iterations(root) if it > iteration]:  # a crash between rename and tracker
        _say(f"--load {root}: {checkpoint_dir(root, newer[-1])} is complete but {TRACKER} names {iteration}: "
             f"loading {iteration} (write {newer[-1]} into the tracker to resume from it)")
    directory = checkpoint_dir(root, iteration)
    common = dist_checkpointing.load_common_state_dict(directory)
    saved = _saved_facts(common, checkpoint)
    lora_checkpoint.check((common.get(mlm.OURS) or {}).get("lora"), part, directory, lora, args)
    mismatched = mismatches(saved["fingerprint"], args)
    if mismatched:
        raise CheckpointError(f"checkpoint {directory} was written for a different model "
                              f"({describe_mismatches(mismatched, args)}) by {saved['written_by']}")
    starts_over = checkpoint.finetune or saved["model_only"] or part == "base"
    load_optim = not (starts_over or checkpoint.no_load_optim) and saved["has_optim"]
    load_rng = not (starts_over or checkpoint.no_load_rng) and saved["has_rng"]
    if (load_optim and saved["distributed_optimizer"] != bool(checkpoint.use_distributed_optimizer)
            and not (fsdp_checkpoint.loads_in_place(checkpoint) and fsdp_checkpoint.takes_distributed_state(saved))
            and not plain_to_distributed_optimizer.applies(saved, checkpoint)):
        distopt = saved["distributed_optimizer"]
        if distopt and fsdp_checkpoint.loads_in_place(checkpoint):  # a distributed-optimizer format FSDP2 cannot take
            sharding = saved["content"].get("distrib_optim_sharding_type")
            raise CheckpointError(f"checkpoint {directory} holds distributed-optimizer state in the '{sharding}' "
                                  f"format, which torch FSDP2's optimizer does not load (a fully reshardable one: "
                                  f"Megatron-LM's --dist-ckpt-optim-fully-reshardable, always so in mtmegatron); "
                                  f"pass --no-load-optim to load the weights only")
        raise CheckpointError(f"checkpoint {directory} holds {'distributed' if distopt else 'plain'}-optimizer "
                              f"state; run with{'' if distopt else 'out'} --use-distributed-optimizer, or "
                              f"pass --no-load-optim to load the weights only")
    # a LoRA checkpoint's expert state is its adapters': the same keys for grouped and sequential (lora/grouped.py)
    _check_experts_optimizer_state(saved, checkpoint, load_optim and part != "adapters", directory)
    content = saved["content"]
    sharding = content.get("distrib_optim_sharding_type")
    if (load_optim and checkpoint.use_distributed_optimizer and saved["distributed_optimizer"]
            and saved["layout"] != _layout()
            and sharding not in DistributedOptimizer.checkpoint_fully_reshardable_formats):
        raise CheckpointError(f"checkpoint {directory}: its distributed-optimizer state ('{sharding}', Megatron-LM's "
                              f"default) loads only under its own TP/PP layout {saved['layout']}, not {_layout()} "
                              f"(save with --dist-ckpt-optim-fully-reshardable); or pass --no-load-optim")
    rng_layouts = ((mlm.stored_rng_shape(directory), mlm.rng_shape()) if saved["megatron_lm_layout"]
                   else (saved["layout"], _layout()))
    if load_rng and (saved["layout"] != _layout() or rng_layouts[0] != rng_layouts[1]):
        # RNG states are per (PP, TP) rank (and DP rank under expert parallelism): they have no meaning under
        # another layout (as in Megatron-LM)
        load_rng = False
        _say(f"checkpoint layout {saved['layout']} (RNG states {rng_layouts[0]}) differs from this run's "
             f"{_layout()} ({rng_layouts[1]}): RNG states not restored (dropout masks will differ from the "
             f"original run)")
    if load_optim:
        _check_optimizer_count(common, optimizer, sharding, directory)
    if load_optim and saved["scheduler"] is not None:
        check_schedule(saved["scheduler"], scheduler, args, directory, CheckpointError)
    metadata = _sharded_metadata(content)
    if megatron_fsdp_checkpoint.applies(checkpoint):  # this rank's rows of the same logical checkpoint, in place
        state = megatron_fsdp_checkpoint.sharded_state(model, _model_keys(model), optimizer if load_optim else None,
                                                       metadata, directory)
    else:
        state = _model_state(model, metadata)
    if part:
        state = lora_checkpoint.select(state, _model_keys(model), part)
    if load_optim and "optimizer" not in state:
        _materialize_optimizer_state(optimizer)
        if plain_to_distributed_optimizer.applies(saved, checkpoint):  # a plain optimizer's state, converted
            state["optimizer"] = plain_to_distributed_optimizer.request(optimizer, state, _sharded_metadata(
                plain_to_distributed_optimizer.request_metadata(content)), directory)
        else:
            state["optimizer"] = optimizer.sharded_state_dict(state, is_loading=True, metadata=metadata)
    if load_rng:
        state["rng_state"] = mlm.rng_state_object() if saved["megatron_lm_layout"] else _legacy_rng_state()
    rerun_template = rerun.load_template(Resilience.of(args), common, saved["layout"] == _layout() and getattr(
        common.get("args"), "world_size", None) == torch.distributed.get_world_size(), checkpoint.finetune)
    if rerun_template:
        state["rerun_state_machine"] = rerun_template
    try:
        loaded = dist_checkpointing.load(state, directory, _load_strategy(directory, checkpoint),
                                         strict=checkpoint.dist_ckpt_strictness)
    # dist_checkpointing raises CheckpointingException, KeyError, RuntimeError, ... and torch's
    # CheckpointException, which is a BaseException
    except (Exception, CheckpointException) as e:
        raise CheckpointError(f"checkpoint {directory} cannot be loaded into this model/layout (damaged files, "
                              f"or written by another model): {_describe(e)}") from e
    if isinstance(loaded, tuple):  # --dist-ckpt-strictness return_*: (state, missing keys, unexpected keys)
        loaded, missing, unexpected = loaded
        _say(f"--dist-ckpt-strictness {checkpoint.dist_ckpt_strictness}: missing {sorted(missing)}, unexpected "
             f"{sorted(unexpected)}")
    in_place = fsdp_checkpoint.loads_in_place(checkpoint)  # FSDP: the load filled the DTensors' local shards itself
    for key, chunk in zip(_model_keys(model), model):
        if not in_place:
            _unwrap(chunk).load_state_dict(loaded[key], strict=part is None)
    if load_optim:
        optimizer_state = _regroup_optimizers(loaded["optimizer"], optimizer)
        if megatron_fsdp_checkpoint.applies(checkpoint):
            optimizer_state = megatron_fsdp_checkpoint.optimizer_state_to_load(optimizer_state, optimizer)
        elif in_place:
            optimizer_state = fsdp_checkpoint.optimizer_state_to_load(optimizer_state, optimizer)
        elif plain_to_distributed_optimizer.applies(saved, checkpoint):
            optimizer_state = plain_to_distributed_optimizer.optimizer_state_to_load(optimizer_state, optimizer)
        optimizer.load_state_dict(optimizer_state)
        scheduler.load_state_dict(loadable_state(saved["scheduler"], scheduler))
    elif optimizer is not None:  # the optimizer's fp32 main copies must follow the freshly loaded weights
        optimizer.reload_model_params()
    if megatron_fsdp_checkpoint.applies(checkpoint):
        megatron_fsdp_checkpoint.finish_load(model)
    if load_rng:
        if saved["megatron_lm_layout"]:
            mlm.restore_rng(loaded["rng_state"])
        else:
            _restore_legacy_rng(loaded["rng_state"])
    if rerun_template:
        rerun.restore(Resilience.of(args), loaded["rerun_state_machine"])
    if train_state is not None and not starts_over:
        train_state.update(saved["train_state"])
        if not train_state.get("consumed_train_samples"):  # a checkpoint without the count: Megatron-LM's rule
            train_state["consumed_train_samples"] = int(common["iteration"]) * checkpoint.global_batch_size
    if saved["written_by"] == "Megatron-LM":
        _say(f"loaded Megatron-LM checkpoint {directory} (model{', optimizer and schedule' if load_optim else ''}"
             f"{', RNG' if load_rng else ''}; sharded-state metadata {content})")
    return 0 if starts_over else int(common["iteration"])
