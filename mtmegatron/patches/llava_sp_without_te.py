"""LLaVA with sequence parallelism on our attention, without TransformerEngine.

Target: megatron.core.models.multimodal.llava_model:LLaVAModel.__init__
Reason: the constructor asserts that a language model with sequence (or context) parallelism uses TE's
``TEDotProductAttention`` ("Sequence/Context Parallelism is supported only with TE DotProductAttention"). The
assertion guards TE's padding-mask/THD paths; LLaVAModel itself only scatters the combined image+text
embeddings to the sequence-parallel region, which works with any core attention that takes the causal mask
(our SDPA, fused-softmax and megatron's local one, all of which SP already runs in our GPT models). The wrapper
lets the check see the spec's own core attention during construction when sequence parallelism is on and
context parallelism is off; context parallelism keeps megatron's assertion (LLaVAModel's CP path also imports
``megatron.training`` and TE >= 1.10, and ``--model llava`` refuses CP before process groups start).
Versions: megatron-core 0.16.x. Backends: all.
"""

import functools

from .base import Patch, current, set_attr

TARGET = "megatron.core.models.multimodal.llava_model:LLaVAModel.__init__"
MODULE = "megatron.core.models.multimodal.llava_model"


def apply():
    original = current(TARGET)
    import importlib

    module = importlib.import_module(MODULE)

    @functools.wraps(original)
    def __init__(self, language_transformer_config, language_transformer_layer_spec, *args, **kwargs):
        config = language_transformer_config
        if not (config.sequence_parallel and config.context_parallel_size == 1):
            return original(self, config, language_transformer_layer_spec, *args, **kwargs)
        core_attention = language_transformer_layer_spec.submodules.self_attention.submodules.core_attention
        missing = object()
        saved = getattr(module, "TEDotProductAttention", missing), module.HAVE_TE
        module.TEDotProductAttention, module.HAVE_TE = core_attention, True  # TE's class is absent without TE
        try:
            return original(self, config, language_transformer_layer_spec, *args, **kwargs)
        finally:
            if saved[0] is missing:
                del module.TEDotProductAttention
            else:
                module.TEDotProductAttention = saved[0]
            module.HAVE_TE = saved[1]

    return set_attr(TARGET, __init__)


PATCH = Patch(
    name="llava_sp_without_te",
    target=TARGET,
    reason="LLaVAModel asserts TE's core attention whenever sequence parallelism is on; SP only scatters the "
    "combined embeddings, which our causal-mask attentions handle",
    versions=">=0.16,<0.17",
    apply=apply,
)
