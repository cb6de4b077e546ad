"""Loading a resharded distributed-optimizer checkpoint with torch's Adam (no apex/TransformerEngine).

Target: megatron.core.optimizer.distrib_optimizer:DistributedOptimizer._set_main_param_and_optimizer_states
Reason: for the 'fully_reshardable' format, load_parameter_state_from_fully_reshardable deliberately leaves
torch Adam's per-param "step" out of the tensors it hands over (load_state_dict restores "step" from the
param groups), but _set_main_param_and_optimizer_states copies every key of the live optimizer state,
including "step", and fails with KeyError: 'step'. So resuming from such a checkpoint is impossible without
apex/TE (CPU, MUSA without MT-TE). The replacement hides "step" from that copy and puts it back untouched.
Versions: megatron-core 0.16.x.
"""

from .base import Patch, current, set_attr

TARGET = "megatron.core.optimizer.distrib_optimizer:DistributedOptimizer._set_main_param_and_optimizer_states"


def apply():
    original = current(TARGET)

    def _set_main_param_and_optimizer_states(self, model_param, tensors):
        if "step" in tensors or self.config.use_precision_aware_optimizer_no_fp8_or_ds_fp8:
            return original(self, model_param, tensors)
        group_index, group_order = self.model_param_group_index_map[model_param]
        state = self.optimizer.state[self.optimizer.param_groups[group_index]["params"][group_order]]
        if "step" not in state:
            return original(self, model_param, tensors)
        step = state.pop("step")
        try:
            return original(self, model_param, tensors)
        finally:
            state["step"] = step

    return set_attr(TARGET, _set_main_param_and_optimizer_states)


PATCH = Patch(
    name="distopt_torch_adam_step",
    target=TARGET,
    reason="resharded distributed-optimizer checkpoints fail to load with torch Adam (KeyError: 'step')",
    versions=">=0.16,<0.17",
    apply=apply,
)
