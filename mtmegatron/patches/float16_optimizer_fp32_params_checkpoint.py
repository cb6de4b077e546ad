"""The checkpoint of megatron-core's mixed-precision optimizer when fp32 parameters train beside float16 ones
(fp32 LoRA adapters over a bf16 base, or any fp32 trainable parameter in a ``--bf16``/``--fp16`` run without the
distributed optimizer).

Target: megatron.core.optimizer.optimizer:Float16OptimizerWithFloat16Params.sharded_state_dict
Reason: the optimizer keeps three lists per parameter group (float16 model parameters, their fp32 main copies, and
the fp32 parameters it steps as they are), and torch numbers its state by the order of ``param_groups[g]["params"]``,
where the main copies and the fp32 parameters are interleaved as the model listed them. megatron-core's
``sharded_state_dict`` maps those numbers to the model's sharded tensors from the float16 parameters alone, so with
any fp32 parameter the numbers shift: with no trainable float16 parameter at all (fp32 adapters over a frozen bf16
base) the save fails "Param id 0 does not match any model sharded param"; with some, a state is checked against
another parameter's shape ("Optimizer shape ... does not match model shape ...") or, where the shapes agree, saved
silently under another parameter's key. The replacement maps each number
to the model parameter behind that position (a main copy's float16 parameter, else the parameter itself) and each
fp32 main copy to its own position; with no fp32 parameter it is megatron-core's method, unchanged (the same
mapping: float16 parameters in optimizer order). Loading reads the same structure (``load_state_dict`` is
megatron-core's: it copies the main copies back per group, in their own order).
Versions: megatron-core 0.16.x.
"""

from __future__ import annotations

from .base import Patch, current, set_attr

TARGET = "megatron.core.optimizer.optimizer:Float16OptimizerWithFloat16Params.sharded_state_dict"


def _positions(optimizer) -> tuple[list, dict[int, int]]:
    """(the model parameter behind each optimizer position, in torch's state numbering; position of each main copy)"""
    model_of = {id(main): p for f16, mains in zip(optimizer.float16_groups, optimizer.fp32_from_float16_groups)
                for p, main in zip(f16, mains)}
    params = [p for group in optimizer.optimizer.param_groups for p in group["params"]]
    return [model_of.get(id(p), p) for p in params], {id(p): i for i, p in enumerate(params)}


def apply():
    original = current(TARGET)

    def sharded_state_dict(self, model_sharded_state_dict, is_loading=False, metadata=None):
        if self.is_stub_optimizer or not any(self.fp32_from_fp32_groups):
            return original(self, model_sharded_state_dict, is_loading, metadata)
        from megatron.core.dist_checkpointing.optimizer import (get_param_id_to_sharded_param_map,
                                                                make_sharded_optimizer_tensor,
                                                                optim_state_to_sharding_state)

        if is_loading:
            self.init_state_fn(self.optimizer, self.config)
        state_dict = self.state_dict()
        model_params, position = _positions(self)
        id_to_sharded_param_map = get_param_id_to_sharded_param_map(model_sharded_state_dict, model_params)
        state_dict["fp32_from_fp16_params"] = [
            [make_sharded_optimizer_tensor(id_to_sharded_param_map[position[id(main)]], main,
                                           prefix="optimizer.state.fp32_param") for main in mains]
            for mains in self.fp32_from_float16_groups]
        step = self._extract_common_per_param_step(state_dict["optimizer"])
        optim_state_to_sharding_state(state_dict["optimizer"], id_to_sharded_param_map, exclude_keys="step")
        if step:
            state_dict["optimizer"]["state"]["common_step"] = step
        return state_dict

    return set_attr(TARGET, sharded_state_dict)


PATCH = Patch(
    name="float16_optimizer_fp32_params_checkpoint",
    target=TARGET,
    reason="megatron-core's mixed-precision optimizer maps its checkpoint's state numbers from the float16 "
    "parameters alone: a run with fp32 trainable parameters beside bf16 ones (fp32 LoRA adapters) could not save",
    versions=">=0.16,<0.17",
    apply=apply,
)
