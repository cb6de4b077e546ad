"""torch FSDP2's wrapper takes ``finish_grad_sync(force_all_reduce=...)`` (backport of Megatron-LM 6ee356a53d).

Target: megatron.core.distributed.torch_fully_sharded_data_parallel:TorchFullyShardedDataParallel.finish_grad_sync
Reason: megatron-core 0.16.1's ``finalize_model_grads`` calls ``finish_grad_sync(force_all_reduce=...)`` on every
model chunk, and TorchFullyShardedDataParallel inherits _BaseDataParallel's ``finish_grad_sync()``, which takes no
argument: ``--use-torch-fsdp2`` fails after the first backward on every backend (TypeError: unexpected keyword
argument 'force_all_reduce'). Upstream adds the keyword and calls the base method, as this does (FSDP2 reduces
the gradients in its own backward hooks).
Versions: megatron-core 0.16.x. Backends: all.
"""

from .base import Patch, current, set_attr

TARGET = "megatron.core.distributed.torch_fully_sharded_data_parallel:TorchFullyShardedDataParallel.finish_grad_sync"
BASE = "megatron.core.distributed.data_parallel_base:_BaseDataParallel.finish_grad_sync"


def apply():
    base = current(BASE)

    def finish_grad_sync(self, force_all_reduce=False):
        return base(self)

    return set_attr(TARGET, finish_grad_sync, must_exist=False)


PATCH = Patch(
    name="torch_fsdp2_finish_grad_sync",
    target=TARGET,
    reason="finalize_model_grads calls finish_grad_sync(force_all_reduce=...), which megatron-core's FSDP2 "
    "wrapper does not take (backport of Megatron-LM 6ee356a53d)",
    versions=">=0.16,<0.17",
    apply=apply,
)
