"""The CLIP/SigLIP encoder's pre/post norms without TransformerEngine.

Target: megatron.core.models.vision.clip_vit_model:CLIPViTModel.__init__
Reason: ``CLIPViTModel`` builds ``ln_pre`` (CLIP) / ``ln_post`` (SigLIP) with ``build_module(NORM_IMPL,
config=..., hidden_size=..., eps=...)``, where ``NORM_IMPL`` is TE's ``TENorm`` or, without TransformerEngine,
``torch.nn.LayerNorm`` — which takes no ``config`` and fails ("LayerNorm.__init__() got an unexpected keyword
argument 'config'"). ``LLaVAModel`` never passes its own norm, so without TE no LLaVA model can be built at all.
The wrapper passes megatron-core's ``WrappedTorchNorm`` (the local spec's norm: a torch LayerNorm built from the
config) when the caller did not choose a norm and TE is absent; with TE nothing changes.
Versions: megatron-core 0.16.x. Backends: all (any install without TransformerEngine).
"""

import functools

from .base import Patch, current, set_attr

TARGET = "megatron.core.models.vision.clip_vit_model:CLIPViTModel.__init__"


def apply():
    original = current(TARGET)
    from megatron.core.models.vision import clip_vit_model
    from megatron.core.transformer.torch_norm import WrappedTorchNorm

    if clip_vit_model.NORM_IMPL is not __import__("torch").nn.LayerNorm:  # TE's TENorm takes the config
        return lambda: None

    @functools.wraps(original)
    def __init__(self, transformer_config, transformer_layer_spec, *args, **kwargs):
        kwargs.setdefault("ln_pre_impl", WrappedTorchNorm)
        kwargs.setdefault("ln_post_impl", WrappedTorchNorm)
        return original(self, transformer_config, transformer_layer_spec, *args, **kwargs)

    return set_attr(TARGET, __init__)


PATCH = Patch(
    name="clip_vit_norm_without_te",
    target=TARGET,
    reason="without TE, CLIPViTModel builds its pre/post norm as torch.nn.LayerNorm(config=...), which fails; "
    "megatron-core's WrappedTorchNorm is the local norm that takes the config",
    versions=">=0.16,<0.17",
    apply=apply,
)
