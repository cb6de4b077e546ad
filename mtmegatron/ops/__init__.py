"""mtmegatron fused kernel library: torch.library ops in namespace `mtmegatron` (schema, Python reference,
fake kernel, autograd) and the native kernels from `mtmegatron._C` registered per dispatch key.

Importing this package declares every op and then loads the native library; when it is missing the ops still
work through their references. `native_available(device)` tells whether native kernels serve a device.
May assume: torch >= 2.7; no device context is created on import.
"""
from __future__ import annotations

from . import activation, adam, cross_entropy, moe, native, norm, rope, router, softmax  # noqa: F401  (declare ops)
from .adam import adam_step
from .cross_entropy import cross_entropy as fused_cross_entropy
from .moe import permute, unpermute
from .native import load, native_available
from .norm import rms_norm
from .rope import fused_apply_rotary_pos_emb
from .router import topk_routing_with_score_function
from .softmax import scaled_masked_softmax, scaled_upper_triang_masked_softmax
from .activation import swiglu
from .vocab_parallel import vocab_parallel_cross_entropy

load()
native.load_musa_extension()  # PrivateUse1 kernels where musa_build.py built them; failures are reported
BUILD_INFO = native.BUILD_INFO

OPS = (
    "rms_norm", "add_rms_norm", "rms_norm_backward", "swiglu", "swiglu_backward", "rope", "rope_backward",
    "scaled_masked_softmax", "scaled_masked_softmax_backward", "scaled_upper_triang_masked_softmax",
    "scaled_upper_triang_masked_softmax_backward", "cross_entropy_stats", "cross_entropy",
    "cross_entropy_backward", "moe_permute_index", "moe_permute", "moe_unpermute", "moe_unpermute_backward",
    "moe_router_topk", "moe_router_topk_backward", "adam_step",
)

__all__ = [
    "OPS", "BUILD_INFO", "native_available", "load", "rms_norm", "swiglu", "fused_apply_rotary_pos_emb",
    "scaled_masked_softmax", "scaled_upper_triang_masked_softmax", "fused_cross_entropy",
    "vocab_parallel_cross_entropy", "permute", "unpermute", "topk_routing_with_score_function", "adam_step",
]
