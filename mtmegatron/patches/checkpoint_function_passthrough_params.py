"""Recompute of a function that returns one of its parameters (``--recompute-modules mlp`` with a biased MLP).

Target: megatron.core.tensor_parallel.random:CheckpointFunction.forward (``tensor_parallel.checkpoint``: the
selective ``mlp``/``moe``/``shared_experts`` recompute and full recompute).
Reason: a module built with ``skip_bias_add`` returns its bias Parameter itself (megatron-core's MLP returns
``(output, linear_fc2.bias)``; Megatron-LM's defaults, ``--add-bias-linear``, build it so). Returned from an
``autograd.Function``, that Parameter is given the Function's node as its ``grad_fn`` (torch rebases the history
of every output that is not an input), so it stops being a leaf, and the recomputation in
``CheckpointFunction.backward`` returns the same Parameter, whose ``grad_fn`` is CheckpointFunction again:
backward re-enters itself without end (measured: ``--recompute-granularity selective --recompute-modules mlp``
without a preset ran no iteration in 180 s; a 4-line Function returning a Parameter shows the rebase in plain
torch, on any device). The replacement returns such a tensor (a leaf that requires grad, not an input) as a
``detach()`` alias: the alias carries the Function's node, the Parameter stays a leaf, and the recomputed
``backward`` sends the bias gradient into it through its own AccumulateGrad (DDP's gradient hooks fire as
without recompute).
Versions: megatron-core 0.16.x (unchanged in 0.19 and main).
"""

import torch

from .base import Patch, current, set_attr

TARGET = "megatron.core.tensor_parallel.random:CheckpointFunction.forward"


def _alias_passthrough(output, inputs):
    if isinstance(output, torch.Tensor) and output.is_leaf and output.requires_grad and not any(
            output is i for i in inputs):
        return output.detach()
    return output


def apply():
    original = current(TARGET).__func__

    def forward(ctx, run_function, distribute_saved_activations, *args):
        outputs = original(ctx, run_function, distribute_saved_activations, *args)
        if isinstance(outputs, (tuple, list)):
            return type(outputs)(_alias_passthrough(o, args) for o in outputs)
        return _alias_passthrough(outputs, args)

    return set_attr(TARGET, staticmethod(forward))


PATCH = Patch(
    name="checkpoint_function_passthrough_params",
    target=TARGET,
    reason="a recomputed module returning its bias Parameter (--recompute-modules mlp with --add-bias-linear) made "
    "the Parameter's grad_fn CheckpointFunction itself: backward recursed without end",
    versions=">=0.16,<0.17",
    apply=apply,
)
