"""megatron-core's text generation controller draws its samples from a host generator on the CPU backend.

Target: megatron.core.inference.text_generation_controllers.text_generation_controller:TextGenerationController.__init__
Reason: the controller builds its sampling generator as ``torch.Generator`` on the current accelerator index.
On the CPU backend ``current_device()`` is the index 0, and torch refuses a generator on an accelerator index
when there is none ("Cannot access accelerator device when none is available"). A constructor is not a torch
function, so the bridge's device remapping never sees it. The replacement runs the original constructor with
``torch.Generator`` answering an accelerator index or device with a host generator (the CPU backend's
device memory is the host's), and restores it before returning; everything else in the constructor is
megatron-core's.
Versions: megatron-core 0.16.x. Backends: cpu only.
"""

import torch

from mtmegatron.backends.device import on_host

from .base import Patch, current, set_attr

TARGET = ("megatron.core.inference.text_generation_controllers.text_generation_controller:"
          "TextGenerationController.__init__")


def _host_generator(generator_class):
    def make(device=None):
        is_accelerator = (isinstance(device, int) and not isinstance(device, bool)) or \
            (device is not None and not on_host(device))
        return generator_class(device="cpu" if is_accelerator else device)

    return make


def apply():
    original = current(TARGET)

    def __init__(self, *args, **kwargs):
        generator_class = torch.Generator
        torch.Generator = _host_generator(generator_class)
        try:
            original(self, *args, **kwargs)
        finally:
            torch.Generator = generator_class

    return set_attr(TARGET, __init__)


PATCH = Patch(
    name="inference_sampling_generator_on_host",
    target=TARGET,
    reason="the inference controller builds torch.Generator(device=<accelerator index>); on the cpu backend "
    "that index names no device, so its sampling generator is made on the host",
    versions=">=0.16,<0.17",
    apply=apply,
    backends=("cpu",),
)
