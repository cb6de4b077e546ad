"""megatron-core's inference pipeline send/receive/broadcast accept host tensors on the CPU backend.

Target: megatron.core.inference.communication_utils:_is_cuda
Reason: before each pipeline send, receive and logits broadcast of inference, megatron-core asserts
``tensor.is_cuda``. On the CPU backend the device memory is the host's and gloo moves host tensors, so the
assertion fails on a correct tensor (on MUSA, torchada answers ``is_cuda`` for MUSA tensors). The replacement
keeps the not-None check and accepts a tensor on the host. The contiguity check beside it is unchanged.
Versions: megatron-core 0.16.x. Backends: cpu only.
"""

from mtmegatron.backends.device import on_host

from .base import Patch, current, set_attr

TARGET = "megatron.core.inference.communication_utils:_is_cuda"


def _on_host_device(tensor):
    assert tensor is not None
    assert on_host(tensor.device)


def apply():
    current(TARGET)
    return set_attr(TARGET, _on_host_device)


PATCH = Patch(
    name="inference_pipeline_tensors_on_host",
    target=TARGET,
    reason="inference's pipeline send/recv/broadcast assert tensor.is_cuda; on the cpu backend the device "
    "tensors are host tensors, which gloo sends",
    versions=">=0.16,<0.17",
    apply=apply,
    backends=("cpu",),
)
