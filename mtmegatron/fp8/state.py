"""Delayed-scaling state of one FP8 linear: amax history and scale for its input, weight and output gradient.

Each cast uses the scale computed from the history so far; the amax it saw is then reduced (MAX) over the
amax-reduction group, pushed into the history, and the scale recomputed (``max`` or ``most_recent`` over the
history, ``fp8_max * 2^-margin / amax``, old scale kept for a zero/non-finite amax). The state is plain fp32
tensors (not module buffers, so Float16Module's ``.bfloat16()`` leaves it alone) and travels in checkpoints as
the linear's ``_extra_state``.
May assume: torch.distributed is initialised when a group is given.
"""

from __future__ import annotations

import torch

from .recipes import FP8_MAX, DelayedScaling
from .scaling import delayed_scale

ROLES = ("input", "weight", "grad_output")


class DelayedScalingState:
    def __init__(self, recipe: DelayedScaling, group=None, device=None):
        self.recipe = recipe
        self.group = group
        self.amax_history = torch.zeros(recipe.amax_history_len, len(ROLES), dtype=torch.float32, device=device)
        self.scale = torch.ones(len(ROLES), dtype=torch.float32, device=device)
        self._fp8_max = torch.tensor([FP8_MAX[recipe.fwd_dtype], FP8_MAX[recipe.fwd_dtype],
                                      FP8_MAX[recipe.bwd_dtype]], device=device)

    def scale_of(self, role: str) -> torch.Tensor:
        return self.scale[ROLES.index(role)].clone()

    def record(self, amaxes: dict[str, torch.Tensor]) -> None:
        """Push the amaxes just seen (one all-reduce for all of them) and update those roles' scales."""
        columns = [ROLES.index(role) for role in amaxes]
        current = torch.stack([a.float().reshape(()) for a in amaxes.values()])
        if self.group is not None and torch.distributed.get_world_size(self.group) > 1:
            torch.distributed.all_reduce(current, op=torch.distributed.ReduceOp.MAX, group=self.group)
        history = self.amax_history
        history[:, columns] = torch.roll(history[:, columns], 1, dims=0)
        history[0, columns] = current
        if self.recipe.amax_compute_algo == "max":
            amax = history[:, columns].amax(dim=0)
        else:
            amax = history[0, columns]
        self.scale[columns] = delayed_scale(amax, self._fp8_max[columns], self.recipe.margin, self.scale[columns])

    def to(self, device) -> None:
        """Move the state to ``device`` (with the layer's weight: the model is built on the host)."""
        self.amax_history = self.amax_history.to(device)
        self.scale = self.scale.to(device)
        self._fp8_max = self._fp8_max.to(device)

    def state_dict(self) -> dict:
        return {"recipe": "delayed", "amax_history": self.amax_history.clone(), "scale": self.scale.clone()}

    def load_state_dict(self, state: dict) -> None:
        if state.get("recipe") != "delayed" or state["amax_history"].shape != self.amax_history.shape:
            raise ValueError(f"FP8 state in the checkpoint ({state.get('recipe')}, history "
                             f"{tuple(state['amax_history'].shape)}) does not match this run (delayed, history "
                             f"{tuple(self.amax_history.shape)}); check --fp8-recipe/--fp8-amax-history-len")
        self.amax_history.copy_(state["amax_history"])
        self.scale.copy_(state["scale"])
