"""Megatron-FSDP's parameter all-gather on gloo: synchronous, never left in flight.

Target: megatron.core.distributed.fsdp.src.megatron_fsdp.param_and_grad_buffer:AllGatherPipeline.all_gather_params
Reason: with ``optim_grads_params`` megatron-core forces ``overlap_param_gather`` on and issues each FSDP unit's
parameter all-gather (and the prefetch of the next units) as an asynchronous coalesced collective on the
data-parallel group, waited for later when the unit runs. On gloo such a gather is still running on the process
group's worker thread while the main thread issues the synchronous gradient reduce-scatter on the same group.
Measured at TP2 x DP2 on the tiny llama3 (5 iterations, 4 ranks, on a 2-core box loaded by other work): 2 of 34
runs ended with a rank killed by SIGABRT or SIGSEGV (the SIGSEGV inside the coalesced gradient reduce-scatter), the
other ranks reporting 'Connection reset by peer'; the CI suite hung or failed on this twice. With this patch: 0 of
60 runs, losses identical. The replacement passes ``async_param_gather=False``: megatron-core's own synchronous branch (the
coalesced all-gather completes inside its coalescing manager), so a gather is done before the unit that asked for
it (or prefetched it) returns. Losses are unchanged (the same values are gathered; only when the gather runs moves).
Versions: megatron-core 0.16.x. Backends: cpu (gloo). On NCCL/MCCL the gather overlaps compute on its own stream,
which is the point of the overlap, so it is left alone there.
"""

from .base import Patch, current, set_attr

TARGET = ("megatron.core.distributed.fsdp.src.megatron_fsdp.param_and_grad_buffer:"
          "AllGatherPipeline.all_gather_params")


def apply():
    original = current(TARGET)

    def all_gather_params(self, params, *args, **kwargs):
        if len(args) >= 4:  # async_param_gather passed by position (prefetch, order, size, async)
            args = args[:3] + (False,) + args[4:]
        else:
            kwargs["async_param_gather"] = False
        return original(self, params, *args, **kwargs)

    return set_attr(TARGET, all_gather_params)


PATCH = Patch(
    name="megatron_fsdp_gloo_sync_param_gather",
    target=TARGET,
    reason="an asynchronous Megatron-FSDP parameter all-gather in flight on gloo beside the gradient reduce-scatter "
    "crashed ranks (SIGSEGV/SIGABRT, 2 of 34 TP2 x DP2 runs): gather synchronously on the cpu backend",
    versions=">=0.16,<0.17",
    apply=apply,
    backends=("cpu",),
)
