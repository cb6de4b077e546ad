"""Multi-latent attention without TransformerEngine.

Target: megatron.core.transformer.multi_latent_attention:HAVE_TE
Reason: the module sets ``HAVE_TE = True`` whenever ``megatron.core.extensions.transformer_engine`` imports,
which it does without TransformerEngine installed (its TE classes are then MagicMock placeholders and its
own ``HAVE_TE`` is False). ``MLASelfAttention`` then runs ``isinstance(self.linear_proj, TELinear)`` with a
placeholder and fails with "isinstance() arg 2 must be a type" while building the layer. The replacement
copies the extension module's own ``HAVE_TE``. With TransformerEngine installed nothing changes.
Versions: megatron-core 0.16.x. Backends: all (any install without TransformerEngine).
"""

from .base import Patch, current, set_attr

TARGET = "megatron.core.transformer.multi_latent_attention:HAVE_TE"


def apply():
    current(TARGET)
    from megatron.core.extensions import transformer_engine

    return set_attr(TARGET, bool(current(TARGET) and transformer_engine.HAVE_TE))


PATCH = Patch(
    name="mla_without_te",
    target=TARGET,
    reason="MLA reports TransformerEngine present when only megatron's TE wrapper module imports, then "
    "calls isinstance(x, <placeholder>); the flag follows the TE extension's own HAVE_TE",
    versions=">=0.16,<0.17",
    apply=apply,
)
