"""Per-parameter Adam step counters after loading a distributed-optimizer checkpoint (torch Adam).

Target: megatron.core.optimizer.distrib_optimizer:DistributedOptimizer.load_state_dict
Reason: without apex/TransformerEngine, load_state_dict rebuilds torch Adam's per-param "step" from the
param groups and assigns the *same* tensor object to every parameter's state. torch's Adam increments each
state's step in place, so after the first resumed step the shared counter has advanced once per parameter:
bias correction is wrong and the resumed run silently diverges from the uninterrupted one (nothing raises).
The replacement runs the original and then gives every parameter its own copy of the counter.
Versions: megatron-core 0.16.x.
"""

import torch

from .base import Patch, current, set_attr

TARGET = "megatron.core.optimizer.distrib_optimizer:DistributedOptimizer.load_state_dict"


def apply():
    original = current(TARGET)

    def load_state_dict(self, state_dict):
        result = original(self, state_dict)
        for state in self.optimizer.state.values():
            step = state.get("step")
            if torch.is_tensor(step):
                state["step"] = step.detach().clone()
        return result

    return set_attr(TARGET, load_state_dict)


PATCH = Patch(
    name="distopt_torch_adam_shared_step",
    target=TARGET,
    reason="after loading, torch Adam's step counter is one tensor shared by all params (advanced once per "
    "param per step): give each param its own",
    versions=">=0.16,<0.17",
    apply=apply,
)
