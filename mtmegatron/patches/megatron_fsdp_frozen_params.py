"""Megatron-FSDP with frozen parameters (``requires_grad=False``) in its units: a LoRA run's base under adapters.

Targets: megatron.core.distributed.fsdp.src.megatron_fsdp.megatron_fsdp:MegatronFSDP._register_fsdp_hooks,
megatron.core.distributed.fsdp.src.megatron_fsdp.param_and_grad_buffer:ParamAndGradBuffer.reduce_scatter_gradients.
Reason: megatron-core 0.16.1 keeps frozen parameters in parameter groups of their own with no gradient buffer
(``requires_grad`` per group) and builds the optimizer over the trainable ones only, but two places assume every
parameter trains: ``_register_fsdp_hooks`` registers ``register_post_accumulate_grad_hook`` on every parameter of
an FSDP unit, which torch refuses for a frozen one ("cannot register a hook on a tensor that doesn't require
gradient", while the model is wrapped); and ``reduce_scatter_gradients`` (optim, optim_grads, optim_grads_params
without --overlap-grad-reduce) first asserts over every group's ``main_grad_buffer``, which is None for the frozen
groups ('NoneType' object has no attribute 'is_data_distributed'), though its loop then skips them. The
replacements skip frozen parameters when hooking (they never get a gradient to reduce) and hand the reduce only the
groups that have a gradient buffer. A model with no frozen parameter is hooked and reduced exactly as before.
Measured (tiny llama3, hidden 128, LoRA r 8, fp32, DP2, 6 iterations): no_shard, optim, optim_grads and
optim_grads_params equal DDP within 1.2e-7; adapters saved under optim_grads_params resume exactly (docs/lora.md).
Versions: megatron-core 0.16.x. Backends: all.
"""

import torch

from .base import Patch, current, set_attr, undo_in_reverse

FSDP = "megatron.core.distributed.fsdp.src.megatron_fsdp.megatron_fsdp:MegatronFSDP._register_fsdp_hooks"
REDUCE = ("megatron.core.distributed.fsdp.src.megatron_fsdp.param_and_grad_buffer:"
          "ParamAndGradBuffer.reduce_scatter_gradients")


class _NoHook:
    """The handle of a hook not registered on a frozen parameter."""

    def remove(self) -> None:
        pass


def apply():
    original_hooks, original_reduce = current(FSDP), current(REDUCE)

    def _register_fsdp_hooks(self, root_module):
        register = torch.Tensor.register_post_accumulate_grad_hook

        def trainable_only(param, hook):
            return register(param, hook) if param.requires_grad else _NoHook()

        torch.Tensor.register_post_accumulate_grad_hook = trainable_only
        try:
            return original_hooks(self, root_module)
        finally:
            torch.Tensor.register_post_accumulate_grad_hook = register

    def reduce_scatter_gradients(self, *args, **kwargs):
        groups = self.parameter_groups
        self.parameter_groups = [g for g in groups if g.main_grad_buffer is not None]
        try:
            return original_reduce(self, *args, **kwargs)
        finally:
            self.parameter_groups = groups

    return undo_in_reverse([set_attr(FSDP, _register_fsdp_hooks), set_attr(REDUCE, reduce_scatter_gradients)])


PATCH = Patch(
    name="megatron_fsdp_frozen_params",
    target=FSDP,
    reason="Megatron-FSDP hooks every unit parameter for gradients and asserts a gradient buffer for every parameter "
    "group: a frozen parameter (LoRA's base) fails both; skip the frozen ones",
    versions=">=0.16,<0.17",
    apply=apply,
)
