"""megatron-core's grouped-GEMM hook served by torch's grouped matmul (or a per-expert loop) when the
``grouped_gemm`` package is not installed.

Target: megatron.core.transformer.moe.grouped_gemm_util:grouped_gemm and :ops (read by the legacy ``GroupedMLP``
as ``gg.assert_grouped_gemm_is_available()`` and ``gg.ops.gmm``).
Reason: ``--moe-grouped-gemm`` without TransformerEngine builds megatron-core's ``GroupedMLP``, which needs the
CUDA-only ``grouped_gemm`` package (fanshiqing/grouped_gemm). Binding the module's ``grouped_gemm``/``ops`` to
``mtmegatron.ops.grouped_mm`` (same ``gmm(a, b, batch_sizes, trans_b)`` signature: ``torch._grouped_mm`` where the
installed torch has it for the device, else one matmul per expert) keeps megatron's class, weight layout and
``sharded_state_dict`` (checkpoints convert to and from the sequential experts) on every backend.
When the package is installed, it is left in place.
Versions: megatron-core 0.16.x.
"""

from .base import Patch, resolve, set_attr, undo_in_reverse

MODULE = "megatron.core.transformer.moe.grouped_gemm_util"
TARGET = f"{MODULE}:ops"


def apply():
    owner, _ = resolve(TARGET)
    if not hasattr(owner, "grouped_gemm_is_available") or not hasattr(owner, "ops"):
        raise RuntimeError(f"{MODULE} no longer has grouped_gemm_is_available/ops; review this patch")
    if owner.grouped_gemm_is_available():  # the grouped_gemm package serves it
        return lambda: None
    from mtmegatron.ops import grouped_mm

    return undo_in_reverse([set_attr(f"{MODULE}:grouped_gemm", grouped_mm.package),
                            set_attr(TARGET, grouped_mm.ops)])


PATCH = Patch(
    name="grouped_gemm_ops",
    target=TARGET,
    reason="GroupedMLP (--moe-grouped-gemm without TransformerEngine) needs the CUDA-only grouped_gemm package; "
    "its gmm is served by torch._grouped_mm or a per-expert loop (mtmegatron/ops/grouped_mm.py)",
    versions=">=0.16,<0.17",
    apply=apply,
)
