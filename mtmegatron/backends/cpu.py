"""The CPU backend: a real backend (gloo collectives, CPU kernels), used to debug and test the whole stack.

May assume: nothing beyond torch. Always available.
"""

from .base import Backend

CPU = Backend(
    name="cpu",
    device_type="cpu",
    visible_devices_env=None,
    kernel_dispatch_key="CPU",
    bridge_module="mtmegatron.bridge.cpu",
    fp8_executors=("scaled_mm", "emulated"),
)
