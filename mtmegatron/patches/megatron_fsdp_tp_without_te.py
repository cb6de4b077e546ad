"""Megatron-FSDP wraps a tensor-parallel model built without TransformerEngine.

Target: megatron.core.distributed.fsdp.mcore_fsdp_adapter:TELinear
Reason: with TP > 1, FullyShardedDataParallel's ``_fix_tensor_parallel_attributes`` asks
``isinstance(module, (TELinear,))`` of each parameter's module; without TransformerEngine megatron-core's
``TELinear`` is a placeholder (a MagicMock), not a class, so ``--use-megatron-fsdp --tensor-model-parallel-size 2``
fails at wrap time on every backend without TE ("isinstance() arg 2 must be a type"). The adapter's name is
replaced by a class nothing is an instance of: no module is a TE linear, which is true there, and the
attributes of the local layers (ColumnParallelLinear/RowParallelLinear set ``tensor_model_parallel`` themselves)
are left as they are. Applied only when the adapter's TELinear is not a class (TE absent).
Versions: megatron-core 0.16.x. Backends: all.
"""

from .base import Patch, current, set_attr

TARGET = "megatron.core.distributed.fsdp.mcore_fsdp_adapter:TELinear"


class NoTransformerEngineLinear:
    """Stands for TransformerEngine's Linear where TE is not installed: no module is one."""


def apply():
    if isinstance(current(TARGET), type):
        return lambda: None  # TransformerEngine is installed: its class answers
    return set_attr(TARGET, NoTransformerEngineLinear)


PATCH = Patch(
    name="megatron_fsdp_tp_without_te",
    target=TARGET,
    reason="without TransformerEngine the Megatron-FSDP adapter's TELinear is a placeholder, and its isinstance "
    "check fails with TP > 1: a class nothing is an instance of stands in",
    versions=">=0.16,<0.17",
    apply=apply,
)
