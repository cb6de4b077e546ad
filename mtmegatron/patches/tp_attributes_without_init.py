"""Tensor-parallel weights built without initialisation still say they are tensor-parallel.

Target: megatron.core.tensor_parallel.layers: ColumnParallelLinear / RowParallelLinear / VocabParallelEmbedding
``__init__``.
Reason: in 0.16 the ``tensor_model_parallel`` / ``partition_dim`` / ``partition_stride`` attributes of these
weights are set inside ``_initialize_affine_weight_cpu/gpu`` only, which run only when
``config.perform_initialization`` is on. Built with ``perform_initialization=False`` (Megatron-LM's
``--no-initialization``, and every ``--load``/``--finetune`` run here, whose weights come from the checkpoint) a
TP-sharded weight looks like a TP duplicate: the gradient norm counts it on TP rank 0 only, so clipping and the
logged norm go wrong silently. Measured: a Megatron-LM checkpoint resumed under TP2 logged Megatron-LM's loss at
the first iteration and 4.57088 instead of 4.57106 at the second. The attributes are set after construction,
exactly as the initialisers set them.
Versions: megatron-core 0.16.x.
"""

from .base import Patch, current, set_attr, undo_in_reverse

LAYERS = "megatron.core.tensor_parallel.layers"
TARGETS = {  # class -> the dimension its weight is split along
    f"{LAYERS}:ColumnParallelLinear.__init__": 0,
    f"{LAYERS}:RowParallelLinear.__init__": 1,
    f"{LAYERS}:VocabParallelEmbedding.__init__": 0,
}


def _with_attributes(original, partition_dim: int):
    from megatron.core.tensor_parallel.layers import set_tensor_model_parallel_attributes

    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        weight = getattr(self, "weight", None)
        config = kwargs.get("config")
        if weight is None or config is None or config.perform_initialization:
            return
        if not getattr(weight, "tensor_model_parallel", False):
            set_tensor_model_parallel_attributes(weight, True, partition_dim, kwargs.get("stride", 1))

    return __init__


def apply():
    return undo_in_reverse([set_attr(target, _with_attributes(current(target), dim)) for target, dim in TARGETS.items()])


PATCH = Patch(
    name="tp_attributes_without_init",
    target=next(iter(TARGETS)),  # and RowParallelLinear / VocabParallelEmbedding.__init__ (TARGETS)
    reason="with perform_initialization=False (--no-initialization; --load/--finetune here) megatron-core never "
    "marked TP-sharded weights as tensor-parallel, so the gradient norm and clipping were silently wrong under TP",
    versions=">=0.16,<0.17",
    apply=apply,
)
