"""megatron-core's legacy GroupedMLP in every dtype when mtmegatron's grouped matmul serves it.

Target: megatron.core.transformer.moe.experts:GroupedMLP.forward
Reason: the forward asserts ``config.bf16`` because the ``grouped_gemm`` package's CUTLASS kernels are bf16-only.
``mtmegatron.ops.grouped_mm.gmm`` (installed by the grouped_gemm_ops patch) runs fp32/fp16/bf16, and fp32 is
what the equivalence tests need. The replacement calls the original forward with a read-only view of the layer's
config whose ``bf16`` reads True (the shared config is not touched); with the ``grouped_gemm`` package installed,
or in a bf16 run, the original runs unchanged.
Versions: megatron-core 0.16.x.
"""

import functools

from .base import Patch, current, set_attr

TARGET = "megatron.core.transformer.moe.experts:GroupedMLP.forward"


class _PassesBf16Assert:
    """``config`` with ``bf16`` reading True; every other field read through."""

    bf16 = True

    def __init__(self, config):
        self._config = config

    def __getattr__(self, name):
        return getattr(self._config, name)


def apply():
    original = current(TARGET)
    from megatron.core.transformer.moe import grouped_gemm_util

    from mtmegatron.ops import grouped_mm

    @functools.wraps(original)
    def forward(self, *args, **kwargs):
        if self.config.bf16 or grouped_gemm_util.ops is not grouped_mm.ops:
            return original(self, *args, **kwargs)
        config = self.config
        self.config = _PassesBf16Assert(config)
        try:
            return original(self, *args, **kwargs)
        finally:
            self.config = config

    return set_attr(TARGET, forward)


PATCH = Patch(
    name="grouped_mlp_any_dtype",
    target=TARGET,
    reason="GroupedMLP.forward asserts bf16 (the grouped_gemm package's kernels are bf16-only); mtmegatron's "
    "grouped matmul runs every dtype",
    versions=">=0.16,<0.17",
    apply=apply,
)
