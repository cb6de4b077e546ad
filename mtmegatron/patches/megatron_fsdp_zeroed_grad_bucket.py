"""Megatron-FSDP's temporary gradient buckets start zeroed, padding included.

Target: megatron.core.distributed.fsdp.src.megatron_fsdp.param_and_grad_buffer:TemporaryBucketAllocator.allocate
Reason: with sharded gradients (optim_grads, optim_grads_params; no --fsdp-double-buffer) each gradient bucket is
a fresh ``torch.empty`` (the main-grad buffers get this allocator). The post-backward hook writes every
parameter's gradient into it, but the padding between and after the parameters (alignment, and the rounding of
the bucket to a multiple of the data-parallel size) keeps whatever the allocator handed back. The whole bucket is
reduce-scattered and added into this rank's persistent main-grad shard, padding too. The optimizer and the
gradient norm read only the parameters' slices, but a check over the whole buffer does not: mtmegatron's inf/nan
step check (training/resilience/robustness.py) saw stale non-finite bytes and skipped the step (it reads the parameters'
slices now too: with every new bucket filled with NaN and this patch off, the losses equal DDP's, where the
whole-buffer check skipped every step; this patch keeps the padding clean for any other whole-buffer reader, e.g.
--fsdp-double-buffer's buckets, which it does not cover). On the cpu backend,
glibc hands back recycled heap memory (freshly mapped pages are zero, which is why it happened only sometimes).
Measured with optim_grads_params at DP2: 2 non-finite elements at offsets 16444-16445 of rank 1's 16448-element
shard of the first gradient group (its real data ends at 16416). The step was skipped and the losses left DDP's
from then on (0.1-0.35 apart), in about 1 run of 3. The replacement zeroes a bucket when it is created. Buckets
the allocator already holds are returned unchanged, so gradients that accumulate between fetches are kept. The
parameter all-gather buckets use StorageResizeBasedBucketAllocator, whose ``allocate`` does not call this one,
so they are untouched.
Remove when: megatron-core initialises (or masks) the padding of its temporary gradient buckets.
Versions: megatron-core 0.16.x. Backends: all. Any allocator can return dirty memory (CUDA's caching allocator
does too). The cost is one memset per gradient bucket per step.
"""

from .base import Patch, current, set_attr

TARGET = "megatron.core.distributed.fsdp.src.megatron_fsdp.param_and_grad_buffer:TemporaryBucketAllocator.allocate"


def apply():
    original = current(TARGET)

    def allocate(self, bucket_id, size, dtype, device, mem_alloc_context=None):
        created = bucket_id not in self.buckets
        bucket = original(self, bucket_id, size, dtype, device, mem_alloc_context)
        if created:
            bucket.data.zero_()
        return bucket

    return set_attr(TARGET, allocate)


PATCH = Patch(
    name="megatron_fsdp_zeroed_grad_bucket",
    target=TARGET,
    reason="Megatron-FSDP's temporary gradient buckets are torch.empty: their padding carries stale bytes "
    "(inf/nan at times) into the main-grad shard; zero each bucket when it is created",
    versions=">=0.16,<0.17",
    apply=apply,
)
