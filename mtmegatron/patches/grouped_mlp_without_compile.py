"""megatron-core's legacy GroupedMLP activations run eagerly on the CPU backend.

Target: megatron.core.transformer.moe.experts:jit_fuser (read by ``GroupedMLP.__init__``, which wraps its GLU and
its activation-times-probability functions in it).
Reason: ``jit_fuser`` is ``torch.compile`` on torch >= 2.2; under the CPU bridge inductor reads CUDA-only device
properties and fails (see expert_bias_without_compile), so ``--moe-grouped-gemm`` would die on its first forward.
On the cpu backend megatron-core's jit fusions are off anyway (models/fusions.py): the experts module gets
megatron-core's own ``noop_decorator``.
Versions: megatron-core 0.16.x. Backends: cpu only.
"""

from .base import Patch, current, set_attr

TARGET = "megatron.core.transformer.moe.experts:jit_fuser"


def apply():
    current(TARGET)
    from megatron.core.jit import noop_decorator

    return set_attr(TARGET, noop_decorator)


PATCH = Patch(
    name="grouped_mlp_without_compile",
    target=TARGET,
    reason="GroupedMLP's activations are torch.compile'd; inductor fails under the cpu bridge, so they run eagerly",
    versions=">=0.16,<0.17",
    apply=apply,
    backends=("cpu",),
)
