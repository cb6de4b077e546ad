"""A plain optimizer's torch_dist state (written under torch FSDP2, or by DDP without --use-distributed-optimizer)
loaded into megatron-core's distributed optimizer, at any TP/DP layout (training/checkpoint/checkpointing.py asks here).

A plain optimizer saves Adam's moments per parameter as global tensors under ``optimizer.state.exp_avg.<param>``
and ``optimizer.state.exp_avg_sq.<param>`` (its mixed-precision form adds the fp32 main weights under
``optimizer.state.fp32_param.<param>``), the step once (``common_step``) and its param groups. The distributed
optimizer's fully reshardable request asks for the same per-parameter tensors, plus its fp32 main weights under
``optimizer.state.param.<param>``: those are taken from ``fp32_param`` where the checkpoint has it, and otherwise
(an fp32 run, whose main weights are the model's) from the model's weights as this load filled them. The step goes
into each param group, where the distributed optimizer keeps it.
May assume: this run uses megatron-core's DistributedOptimizer (possibly chained) and the checkpoint was written
by a plain megatron-core optimizer; the model's weights are loaded before the optimizer's state.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from megatron.core.dist_checkpointing.serialization import load_tensors_metadata

from mtmegatron.training.checkpoint import megatron_lm_checkpoint as mlm
from mtmegatron.training.checkpoint.section import Checkpoint

_MAIN, _SAVED_MAIN = "optimizer.state.param.", "optimizer.state.fp32_param."


def applies(saved: dict, checkpoint: Checkpoint) -> bool:
    """True when this distributed-optimizer run loads a plain optimizer's state."""
    return bool(checkpoint.use_distributed_optimizer) and not saved["distributed_optimizer"]


def request_metadata(content: dict) -> dict:
    """The sharded-state metadata to build the distributed optimizer's request with: the checkpoint's, in the
    fully reshardable format (the one whose per-parameter tensors a plain optimizer's match)."""
    return {**content, **mlm.content_metadata(True)}


def _per_optimizer(state: dict) -> list[dict]:
    """A (possibly chained) optimizer's request or loaded state, one dict per inner optimizer."""
    if isinstance(state, dict) and any(isinstance(k, int) for k in state):
        return [state[k] for k in sorted(k for k in state if isinstance(k, int))]
    return [state]


def request(optimizer, model_state: dict, metadata: dict, directory: str) -> dict:
    """The distributed optimizer's load request with its main weights asked for where the checkpoint holds them
    (``fp32_param``), left out where the model's loaded weights stand for them."""
    stored = load_tensors_metadata(directory)
    asked = optimizer.sharded_state_dict(model_state, is_loading=True, metadata=metadata)
    for inner in _per_optimizer(asked):
        for entry in inner["param_state"].values():
            main = entry.pop("param")
            saved_key = _SAVED_MAIN + main.key[len(_MAIN):]
            if saved_key in stored:
                entry["param"] = replace(main, key=saved_key)
    return asked


def groups_with_step(saved: dict) -> list[dict]:
    """The plain optimizer's param groups (FP32Optimizer: its own state dict; the mixed-precision one: under
    'optimizer') with the common step in each, as the distributed optimizer keeps them."""
    inner = saved["optimizer"] if "optimizer" in saved else saved
    step = inner.get("state", {}).get("common_step")
    step = None if step is None else int(step.item() if isinstance(step, torch.Tensor) else step)
    return [{**{k: v for k, v in group.items() if k != "params"}, "step": step} for group in inner["param_groups"]]


def _main_weights(inner) -> list[torch.Tensor]:
    """The model parameters in the order of the fully reshardable request (buffer by buffer)."""
    return [param for buffer in inner.buffers for param in buffer.param_index_map]


def optimizer_state_to_load(loaded: dict, optimizer) -> dict:
    """The loaded plain state as the distributed optimizer's ``load_state_dict`` takes it (chained: one per
    inner optimizer); main weights the checkpoint does not hold are the model's own, just loaded."""
    inner_optimizers = list(getattr(optimizer, "chained_optimizers", [optimizer]))
    states = []
    for inner, saved in zip(inner_optimizers, _per_optimizer(loaded)):
        weights = _main_weights(inner)
        param_state = {index: entry if "param" in entry else {**entry, "param": weights[index].detach()}
                       for index, entry in saved["param_state"].items()}
        states.append({"optimizer": {"param_groups": groups_with_step(saved)}, "param_state": param_state,
                       "param_state_sharding_type": "fully_reshardable"})
    return states[0] if len(states) == 1 else dict(enumerate(states))
