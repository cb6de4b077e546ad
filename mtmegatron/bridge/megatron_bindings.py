"""The megatron-core modules that bind accelerator-module names at import time, for the bridges that re-bind them.

``from torch.cuda import _lazy_call, _lazy_init, device as device_ctx_manager`` runs once, when megatron-core
is imported; a later change of ``torch.cuda`` (the CPU bridge's module, torchada's redirect to torch.musa) does
not reach these names, so each bridge points them at its own module. May assume: nothing (names only).
"""

LAZY_CALL_MODULES = (
    "megatron.core.tensor_parallel.random",
    "megatron.core.distributed.fsdp.src.megatron_fsdp.utils",
)
