"""Local-spec MoE experts' output bias is not summed over tensor-parallel ranks under sequence parallelism.

Target: megatron.core.tensor_parallel.layers:RowParallelLinear.__init__
Reason: the local RowParallelLinear marks its bias ``sequence_parallel = config.sequence_parallel`` whatever the
layer; ``finalize_model_grads`` then sums every such gradient over the (dense) tensor-parallel group. For an
expert's ``linear_fc2`` that is wrong: megatron-core allows expert biases only at expert-TP 1, so under TP>1 with
sequence parallelism the TP peers hold other experts (EP) or other tokens of the same experts (whose gradients
DDP already reduces over expert-data-parallel ranks). The sum mixes different experts' bias gradients: at
TP2 x EP2 (ETP1) the step-0 gradient of an expert that got no token was non-zero and the loss left the
single-rank curve by 1.4e-4 (relative) at step 1. megatron-core's TE layers never mark expert parameters
``sequence_parallel``; the local expert bias is unmarked after construction likewise.
Versions: megatron-core 0.16.x. Backends: all (any run on the local spec).
"""

from __future__ import annotations

import functools

from .base import Patch, current, set_attr

TARGET = "megatron.core.tensor_parallel.layers:RowParallelLinear.__init__"


def apply():
    original = current(TARGET)

    @functools.wraps(original)
    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        if self.is_expert and self.bias is not None:
            self.bias.sequence_parallel = False

    return set_attr(TARGET, __init__)


PATCH = Patch(
    name="moe_expert_bias_sequence_parallel",
    target=TARGET,
    reason="local-spec expert output biases were marked sequence-parallel, so finalize_model_grads summed "
    "different experts' bias gradients over TP ranks (TP>1 with SP and biases); expert biases are unmarked",
    versions=">=0.16,<0.17",
    apply=apply,
)
