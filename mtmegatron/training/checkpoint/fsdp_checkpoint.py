"""torch_dist checkpoints of a model wrapped in torch FSDP2 (training/checkpoint/checkpointing.py asks here).

Under ``--use-torch-fsdp2`` every parameter, and every optimizer state tensor, is a DTensor sharded over the
data-parallel ranks. megatron-core describes each by its local shard (megatron.core.utils'
make_*sharded_tensor_for_checkpoint: a ShardedTensor whose data is the DTensor's ``_local_tensor``), so the
checkpoint holds the same global tensors as a DDP run's and ``dist_checkpointing.load`` fills the local shards in
place (as Megatron-LM, which skips ``load_state_dict`` for FSDP2 + torch_dist). What is left to do here: not hand
the loaded local shards to the model's ``load_state_dict`` (they are already in its DTensors), and give the
optimizer's ``load_state_dict`` its DTensors back in place of the loaded local shards (torch's Adam cannot mix a
DTensor parameter with a plain state tensor), so the step count and the param groups are restored as well.
A checkpoint of DDP + the distributed optimizer in the fully reshardable format (mtmegatron's only one) keeps Adam's
moments per parameter under the plain optimizer's keys: FSDP2 loads them, its step and param groups converted
(``takes_distributed_state``, ``_from_distributed``). The way back (FSDP2's plain-optimizer state into the
distributed optimizer, at any layout) is training/checkpoint/plain_to_distributed_optimizer.py.
May assume: a torch FSDP2 run (megatron-core's TorchFullyShardedDataParallel); the optimizer is megatron-core's
(chained) FP32/mixed-precision optimizer over the DTensor parameters.
"""

from __future__ import annotations

import torch
from torch.distributed.tensor import DTensor

from mtmegatron.training.checkpoint.section import Checkpoint


def loads_in_place(checkpoint: Checkpoint) -> bool:
    """True when ``dist_checkpointing.load`` writes the model's weights into its parameters itself (torch FSDP2;
    Megatron-FSDP: megatron_fsdp_checkpoint.py)."""
    return bool(checkpoint.use_torch_fsdp2 or checkpoint.use_megatron_fsdp)


def _as_dtensors(saved: dict, inner) -> dict:
    """One optimizer's loaded state with each local-shard tensor replaced by this run's DTensor state it was
    loaded into (same storage); 'step' and the param groups as loaded."""
    params = [p for group in inner.optimizer.param_groups for p in group["params"]]
    state = dict(saved["state"])
    for index, entry in state.items():
        if not isinstance(index, int) or not isinstance(entry, dict):
            continue  # 'common_step'
        current = inner.optimizer.state[params[index]]
        state[index] = {key: current[key] if isinstance(current.get(key), DTensor)
                        and isinstance(value, torch.Tensor) and not isinstance(value, DTensor) else value
                        for key, value in entry.items()}
    return {**saved, "state": state}


def optimizer_state_to_load(loaded: dict, optimizer) -> dict:
    """The loaded optimizer state of an FSDP2 run, ready for ``optimizer.load_state_dict``: a chained
    optimizer's ``{0: .., 1: ..}`` or the one optimizer's own dict, each with its DTensors."""
    inner = list(getattr(optimizer, "chained_optimizers", [optimizer]))
    if "fp32_from_fp16_params" in loaded:  # --bf16: the mixed-precision optimizer's dict around torch's
        return {**loaded, "optimizer": optimizer_state_to_load(loaded["optimizer"], optimizer),
                "fp32_from_fp16_params": inner[0].fp32_from_float16_groups}  # loaded in place, like the moments
    if len(inner) == 1:
        if "param_state_sharding_type" in loaded:  # written by the distributed optimizer
            loaded = _from_distributed(loaded, inner[0])
        return _as_dtensors(loaded, inner[0])
    return {i: _as_dtensors(loaded[i], opt) for i, opt in enumerate(inner)}


def takes_distributed_state(saved: dict) -> bool:
    """A distributed-optimizer checkpoint in the fully reshardable format keeps Adam's moments per parameter under
    the plain optimizer's keys (``optimizer.state.exp_avg.<param>``): FSDP2's optimizer loads them."""
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    sharding = saved["content"].get("distrib_optim_sharding_type")
    return saved["distributed_optimizer"] and sharding in DistributedOptimizer.checkpoint_fully_reshardable_formats


_GROUP_IDENTITY = ("wd_mult", "lr_mult", "is_expert_parallel", "is_decoupled_lr")


def _from_distributed(saved: dict, inner) -> dict:
    """A distributed optimizer's loaded state (its param groups, with the step, under 'optimizer'; the moments
    this run asked for under 'state') as the plain optimizer's state dict."""
    groups = saved["optimizer"]["param_groups"]
    by_identity = {tuple(g.get(k) for k in _GROUP_IDENTITY): g for g in groups}
    ours = inner.optimizer.state_dict()["param_groups"]
    param_groups = [{**{k: v for k, v in by_identity[tuple(g.get(k) for k in _GROUP_IDENTITY)].items() if k != "step"},
                     "params": g["params"]} for g in ours]
    state = {k: v for k, v in saved.get("state", {}).items() if isinstance(k, int)}
    step = groups[0].get("step")
    return {"state": {**state, "common_step": torch.tensor(float(step))} if step is not None else state,
            "param_groups": param_groups}
