"""Local-spec MoE experts with linear biases train without expert parallelism.

Target: megatron.core.tensor_parallel.layers:RowParallelLinear.__init__
Reason: an expert's ``linear_fc2`` (a local RowParallelLinear, ``is_expert=True``) skips its TP reduction only
when ``explicit_expert_comm`` (expert-TP > 1 or EP > 1). With expert-TP 1 and EP 1 (Megatron-LM's plain
``--num-experts 4 --moe-router-topk 2`` on one rank, or any TP1/EP1 layout) its output goes through
``reduce_from_tensor_model_parallel_region`` over a group of one, whose custom Function returns its input
as-is; ``MLP.forward`` then adds the expert bias to it in place (``output += output_bias * per_token_scale``,
mlp.py, unchanged through megatron-core 0.19) and autograd refuses: "Output 0 of
_ReduceFromModelParallelRegion is a view and is being modified inplace". Megatron-LM hits the same with
``--transformer-impl local`` on CUDA (its default TE spec does not use this layer). A reduction over one rank
is the identity both ways, so such a layer is marked ``explicit_expert_comm`` after construction (as
megatron-core's shared experts mark theirs): the matmul's own output is returned, nothing else changes.
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
        if self.is_expert and not self.explicit_expert_comm and self.skip_bias_add and self.tp_group.size() == 1:
            self.explicit_expert_comm = True

    return set_attr(TARGET, __init__)


PATCH = Patch(
    name="moe_expert_bias_without_ep",
    target=TARGET,
    reason="local-spec experts with biases crashed at expert-TP1/EP1 (in-place bias add on the output of a "
    "one-rank TP reduction, a view); their one-rank reduction (the identity) is skipped",
    versions=">=0.16,<0.17",
    apply=apply,
)
