"""MoE router GEMM without TransformerEngine.

Target: megatron.core.transformer.moe.moe_utils.te_general_gemm (read by RouterGatingLinearFunction).
Reason: moe_utils imports te_general_gemm only inside ``try: import transformer_engine``; when TE is absent
the name is never bound, and RouterGatingLinearFunction's ``if te_general_gemm is not None`` raises
NameError, so every MoE model fails without TE (CPU, MUSA without MT-TE). Binding the name to None selects
the torch.mm path megatron-core already has.
Versions: megatron-core 0.16.x.
"""

from .base import Patch, resolve, set_attr

TARGET = "megatron.core.transformer.moe.moe_utils:te_general_gemm"


def apply():
    owner, name = resolve(TARGET)
    if hasattr(owner, name):  # TE is installed: nothing to fix
        return lambda: None
    if not hasattr(owner, "RouterGatingLinearFunction"):
        raise RuntimeError("moe_utils.RouterGatingLinearFunction is gone; review this patch")
    return set_attr(TARGET, None, must_exist=False)


PATCH = Patch(
    name="moe_router_gemm_without_te",
    target=TARGET,
    reason="te_general_gemm is unbound when TransformerEngine is missing (NameError in the MoE router)",
    versions=">=0.16,<0.17",
    apply=apply,
)
