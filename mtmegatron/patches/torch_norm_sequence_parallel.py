"""Sequence parallelism with the local (non-TransformerEngine) norm.

Target: megatron.core.transformer.torch_norm:WrappedTorchNorm.__new__ (the norm the local GPT spec uses when
apex is absent: LNImpl in gpt_layer_specs).
Reason: WrappedTorchNorm asserts ``not config.sequence_parallel`` because it builds a plain torch
LayerNorm/RMSNorm whose parameters lack the ``sequence_parallel`` attribute; without it
finalize_model_grads would not all-reduce the norm gradients over the tensor-parallel group. TENorm and
apex's FusedLayerNorm set that attribute and so support sequence parallelism. On the CPU backend there is no
TE and no apex, yet MoE with TP>1 requires sequence parallelism during training (MoELayer raises otherwise),
so TP×EP MoE cannot be built at all. The replacement builds the same torch norm and marks its parameters
``sequence_parallel=True`` (what TENorm/FusedLayerNorm do); without sequence parallelism it is unchanged.
Versions: megatron-core 0.16.x. Backends: all (it only matters where the local spec meets SP without TE/apex:
CPU, and MUSA without MT-TransformerEngine; with TE the TE norm is used and this code is never reached).
"""

import copy

from .base import Patch, resolve, set_attr

TARGET = "megatron.core.transformer.torch_norm:WrappedTorchNorm.__new__"


def apply():
    owner, name = resolve(TARGET)
    original = owner.__dict__.get(name)
    if not isinstance(original, staticmethod):
        raise RuntimeError(f"{TARGET} is gone or changed shape; review this patch")
    build = original.__func__

    def __new__(cls, config, hidden_size, eps=1e-5, *args, **kwargs):
        if not config.sequence_parallel:
            return build(cls, config, hidden_size, eps, *args, **kwargs)
        plain = copy.copy(config)
        plain.sequence_parallel = False  # only to get past the assert; the norm itself is per-token
        norm = build(cls, plain, hidden_size, eps, *args, **kwargs)
        for param in norm.parameters():
            param.sequence_parallel = True  # finalize_model_grads all-reduces these grads over TP
        return norm

    return set_attr(TARGET, staticmethod(__new__))


PATCH = Patch(
    name="torch_norm_sequence_parallel",
    target=TARGET,
    reason="the local spec's torch norm refuses sequence parallelism (its params lack the sequence_parallel "
    "attribute), so MoE with TP>1, which needs SP, cannot be built without TE/apex",
    versions=">=0.16,<0.17",
    apply=apply,
)
