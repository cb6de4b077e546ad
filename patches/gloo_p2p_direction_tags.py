"""Pipeline point-to-point messages matched by direction on gloo.

Target: megatron.core.pipeline_parallel.p2p_communication:_batched_p2p_ops (the default p2p path,
``config.batch_p2p_comm``).
Reason: gloo matches a receive with the oldest send from the same peer and tag. With the interleaved (VPP)
schedule and two pipeline ranks, the previous and next stage are the same peer, and one batched call may
send an activation forward and a gradient backward to it at once with the same shape and tag 0: each recv
then takes whichever message was posted first, silently swapping activations and gradients (losses of later
micro-batches are wrong; nothing raises). The replacement posts the same operations in the same order with
one tag for forward traffic (send_next/recv_prev) and another for backward traffic (send_prev/recv_next).
Versions: megatron-core 0.16.x. Backends: cpu only (gloo).
"""

import torch

from .base import Patch, set_attr

TARGET = "megatron.core.pipeline_parallel.p2p_communication:_batched_p2p_ops"
FORWARD_TAG, BACKWARD_TAG = 1, 2


def _batched_p2p_ops(*, tensor_send_prev, tensor_recv_prev, tensor_send_next, tensor_recv_next, group,
                     prev_pipeline_rank, next_pipeline_rank):
    dist = torch.distributed
    planned = (
        (dist.isend, tensor_send_prev, prev_pipeline_rank, BACKWARD_TAG),
        (dist.irecv, tensor_recv_prev, prev_pipeline_rank, FORWARD_TAG),
        (dist.isend, tensor_send_next, next_pipeline_rank, FORWARD_TAG),
        (dist.irecv, tensor_recv_next, next_pipeline_rank, BACKWARD_TAG),
    )
    ops = [dist.P2POp(op, tensor, peer, group, tag) for op, tensor, peer, tag in planned if tensor is not None]
    return dist.batch_isend_irecv(ops) if ops else []


def apply():
    return set_attr(TARGET, _batched_p2p_ops)


PATCH = Patch(
    name="gloo_p2p_direction_tags",
    target=TARGET,
    reason="gloo pairs same-peer messages by tag: tag forward and backward pipeline traffic apart (VPP, PP=2)",
    versions=">=0.16,<0.17",
    apply=apply,
    backends=("cpu",),
)
