"""Selective recompute of layernorms without TransformerEngine: ``CheckpointWithoutOutput(fp8=False)`` is not FP8.

Target: megatron.core.tensor_parallel.random:CheckpointWithoutOutput.__init__ (built by TransformerLayer for
``--recompute-modules layernorm``, by MLA for ``mla_up_proj``, by the MoE experts for ``moe_act``).
Reason: 0.16's constructor sets ``self.fp8 = fp8 is not None``, so the default ``fp8=False`` counts as FP8 and the
forward asks TransformerEngine's ``FP8GlobalStateManager`` whether FP8 is on; without TE that name does not
exist and the first training forward dies with ``NameError: name 'FP8GlobalStateManager' is not defined``.
The replacement treats ``None`` and ``False`` as "no FP8" (MLA passes its quantization recipe or None, the
layers pass nothing): with TE installed and FP8 off this takes the same branch TE's "FP8 disabled" answer led to.
Versions: megatron-core 0.16.x.
"""

from .base import Patch, current, set_attr

TARGET = "megatron.core.tensor_parallel.random:CheckpointWithoutOutput.__init__"


def apply():
    original = current(TARGET)

    def __init__(self, fp8=False):
        original(self, fp8)
        self.fp8 = fp8 is not None and fp8 is not False

    return set_attr(TARGET, __init__)


PATCH = Patch(
    name="checkpoint_without_output_fp8_flag",
    target=TARGET,
    reason="CheckpointWithoutOutput(fp8=False) took the FP8 path (fp8 is not None) and needed TE's "
    "FP8GlobalStateManager; --recompute-modules layernorm crashed without TE",
    versions=">=0.16,<0.17",
    apply=apply,
)
