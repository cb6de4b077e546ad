"""torch FSDP2's CPU offload through megatron-core's wrapper: ``fully_shard`` gets the config's offload policy.

Target: megatron.core.distributed.torch_fully_sharded_data_parallel:TorchFullyShardedDataParallel.__init__ and
that module's ``fully_shard``
Reason: TorchFullyShardedDataParallel calls torch's ``fully_shard(module, mesh=..., reshard_after_forward=...)``
with no ``offload_policy``, so torch's ``CPUOffloadPolicy`` (parameter shards, gradients and the optimizer step on
the host; each layer's shard copied to the device for its all-gather) cannot be asked for. The wrapper's
constructor now holds ``ddp_config.offload_policy`` (an attribute mtmegatron sets for ``--torch-fsdp2-cpu-offload``,
training/setup.py; absent: None) while it runs, and the module's ``fully_shard`` passes it on; without it every call
is torch's, unchanged. What else meets the host shards: clip_grads_on_host.py (gradient norm and clipping),
float16_optimizer_host_params.py (--bf16: the mixed-precision optimizer, its fp32 main params on the host),
tp_grad_sync_host_shards.py (sequence parallelism / qk-layernorm at TP > 1: the layer norms' TP all-reduce).
Versions: megatron-core 0.16.x. Backends: all.
"""

from __future__ import annotations

import threading

from .base import Patch, current, set_attr, undo_in_reverse

MODULE = "megatron.core.distributed.torch_fully_sharded_data_parallel"
INIT = f"{MODULE}:TorchFullyShardedDataParallel.__init__"
FULLY_SHARD = f"{MODULE}:fully_shard"

_building = threading.local()  # the offload policy of the wrapper being constructed on this thread


def apply():
    init, fully_shard = current(INIT), current(FULLY_SHARD)

    def __init__(self, config, ddp_config, module, *args, **kwargs):
        _building.policy = getattr(ddp_config, "offload_policy", None)
        try:
            init(self, config, ddp_config, module, *args, **kwargs)
        finally:
            _building.policy = None

    def fully_shard_with_policy(module, **kwargs):
        policy = getattr(_building, "policy", None)
        if policy is not None and "offload_policy" not in kwargs:
            kwargs["offload_policy"] = policy
        return fully_shard(module, **kwargs)

    return undo_in_reverse([set_attr(INIT, __init__), set_attr(FULLY_SHARD, fully_shard_with_policy)])


PATCH = Patch(
    name="torch_fsdp2_cpu_offload",
    target=INIT,
    reason="megatron-core's FSDP2 wrapper calls fully_shard without an offload_policy: --torch-fsdp2-cpu-offload "
    "passes torch's CPUOffloadPolicy",
    versions=">=0.16,<0.17",
    apply=apply,
)
