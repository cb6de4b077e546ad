"""Loaded by a pretrain job started with this folder first on PYTHONPATH (tests/robustness/
test_nonfinite_check_scope.py): every temporary gradient bucket Megatron-FSDP creates starts filled with NaN, the
worst stale bytes an allocator can hand back. Each parameter's gradient overwrites its own slice; the padding keeps
the NaN. Writes one line to $NAN_PADDING_LOG per bucket so the test knows the hook ran.
"""

import os

if os.environ.get("NAN_PADDING_LOG"):
    from megatron.core.distributed.fsdp.src.megatron_fsdp import param_and_grad_buffer as _buffers

    _allocate = _buffers.TemporaryBucketAllocator.allocate

    def _allocate_nan(self, bucket_id, size, dtype, device, mem_alloc_context=None):
        created = bucket_id not in self.buckets
        bucket = _allocate(self, bucket_id, size, dtype, device, mem_alloc_context)
        if created:
            bucket.data.fill_(float("nan"))
            with open(os.environ["NAN_PADDING_LOG"], "a") as log:
                log.write(f"{bucket_id} {size}\n")
        return bucket

    _buffers.TemporaryBucketAllocator.allocate = _allocate_nan
