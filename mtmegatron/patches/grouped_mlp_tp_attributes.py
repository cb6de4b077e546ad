"""megatron-core's legacy GroupedMLP weights built without initialisation still say they are tensor-parallel.

Target: megatron.core.transformer.moe.experts:GroupedMLP.__init__
Reason: as for the linears (tp_attributes_without_init), GroupedMLP's ``weight1`` (split along dim 1) and
``weight2`` (dim 0) get their ``tensor_model_parallel``/``partition_dim``/``partition_stride`` attributes only
inside ``_initialize_affine_weight_cpu/gpu``, which run only with ``config.perform_initialization``. Every
``--load``/``--finetune`` run builds without it, and then the gradient norm counts the expert-TP shards on one TP
rank only: measured, ``--moe-grouped-gemm`` under EP2xTP2 logged a first grad norm of 1.14279 instead of
1.14778 and losses 1.9e-4 off the sequential experts' by iteration 4 (identical with this patch).
Versions: megatron-core 0.16.x.
"""

import functools

from .base import Patch, current, set_attr

TARGET = "megatron.core.transformer.moe.experts:GroupedMLP.__init__"
PARTITION_DIMS = {"weight1": 1, "weight2": 0}


def apply():
    original = current(TARGET)
    from megatron.core.tensor_parallel.layers import set_tensor_model_parallel_attributes

    @functools.wraps(original)
    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        if self.config.perform_initialization:
            return
        for name, dim in PARTITION_DIMS.items():
            weight = getattr(self, name)
            if not getattr(weight, "tensor_model_parallel", False):
                set_tensor_model_parallel_attributes(weight, True, dim, 1)

    return set_attr(TARGET, __init__)


PATCH = Patch(
    name="grouped_mlp_tp_attributes",
    target=TARGET,
    reason="with perform_initialization=False (--load/--finetune) GroupedMLP's weights were not marked "
    "tensor-parallel, so the gradient norm and clipping were wrong under expert TP",
    versions=">=0.16,<0.17",
    apply=apply,
)
